package proxy

import (
	"errors"
	"net"
	"net/http"
	"testing"
)

// A request that never left may go to another worker whatever it is; one
// that may have reached a worker may not, unless it is resendable.
func TestMayResend(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, dialErr := (&http.Transport{}).RoundTrip(mustRequest(t, "http://"+addr+"/x"))
	if dialErr == nil {
		t.Fatal("a closed port accepted a connection")
	}
	sent := []error{
		&retryableStatus{resp: &http.Response{Status: "503 Service Unavailable"}},
		errors.New("read: connection reset by peer"),
		&net.OpError{Op: "read", Err: errors.New("reset")},
	}
	once := &call{noResend: true}
	if !once.mayResend(dialErr) {
		t.Errorf("refused connection (%v) not resendable", dialErr)
	}
	for _, err := range sent {
		if once.mayResend(err) {
			t.Errorf("%v: resent a non-inference POST a worker may have seen", err)
		}
		if !(&call{}).mayResend(err) {
			t.Errorf("%v: an inference request lost its retry", err)
		}
	}
}

func mustRequest(t *testing.T, url string) *http.Request {
	t.Helper()
	r, err := http.NewRequest(http.MethodPost, url, http.NoBody)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestPathSet(t *testing.T) {
	s := newPathSet([]string{"/v1/embeddings", "/v1/audio/*", "/"})
	for p, want := range map[string]bool{
		"/v1/embeddings":           true,
		"/v1/embeddings/":          false,
		"/v1/embeddings/x":         false,
		"/v1/audio/transcriptions": true,
		"/v1/audio/a/b":            true,
		"/v1/audio":                false,
		"/v1/audio/../../sim":      false,
		"/v1/audio//x":             false,
		"/":                        true,
		"":                         false,
		"/sim/fault":               false,
	} {
		if got := s.allows(p); got != want {
			t.Errorf("allows(%q) = %v, want %v", p, got, want)
		}
	}
	if all := newPathSet([]string{"/*"}); !all.allows("/sim/fault") {
		t.Error(`"/*" does not forward everything`)
	}
	if none := newPathSet(nil); none.allows("/v1/embeddings") {
		t.Error("an empty list forwards something")
	}
}
