package credential

import (
	"net/http"
	"testing"
)

func TestBearerToken(t *testing.T) {
	for _, tc := range []struct {
		header string
		want   string
		ok     bool
	}{
		{"Bearer abc", "abc", true},
		{"bearer abc", "abc", true}, // the scheme is case-insensitive
		{"BEARER  abc ", "abc", true},
		{"Bearer ", "", false},
		{"Bearer", "", false},
		{"Basic abc", "", false},
		{"", "", false},
	} {
		h := http.Header{}
		if tc.header != "" {
			h.Set("Authorization", tc.header)
		}
		got, ok := BearerToken(h)
		if got != tc.want || ok != tc.ok {
			t.Errorf("BearerToken(%q) = %q, %v; want %q, %v", tc.header, got, ok, tc.want, tc.ok)
		}
	}
}

func TestSecrets(t *testing.T) {
	d := DigestOf("s3cret")
	for got, want := range map[string]bool{"s3cret": true, "s3cre": false, "s3cret ": false, "": false, "S3CRET": false} {
		if d.Matches(got) != want || Equal(got, "s3cret") != want {
			t.Errorf("%q: match %v, want %v", got, d.Matches(got), want)
		}
	}
}

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:80": true, "127.0.0.1": true, "[::1]:80": true, "::1": true, "127.255.0.1:1": true,
		"10.1.2.3:5555": false, "[::ffff:10.1.2.3]:1": false, "0.0.0.0:1": false, "localhost:80": false, "": false, "garbage": false,
	} {
		if got := IsLoopback(addr); got != want {
			t.Errorf("IsLoopback(%q) = %v, want %v", addr, got, want)
		}
	}
}
