package proxy

import (
	"fmt"
	"testing"
	"time"
)

func TestResponseAffinityBounded(t *testing.T) {
	a := newResponseAffinity(time.Hour, 3)
	now := time.Unix(1000, 0)
	for i := range 5 {
		a.learn(fmt.Sprint("resp_", i), "w", now)
	}
	if a.len() != 3 {
		t.Fatalf("len %d, want 3", a.len())
	}
	if _, ok := a.lookup("resp_0", now); ok {
		t.Fatal("oldest id kept past max_entries")
	}
	// A lookup makes an id recent: it survives the next insertions.
	if _, ok := a.lookup("resp_2", now); !ok {
		t.Fatal("resp_2 lost")
	}
	a.learn("resp_5", "w", now)
	a.learn("resp_6", "w", now)
	if _, ok := a.lookup("resp_2", now); !ok {
		t.Fatal("recently used id evicted before older ones")
	}
	// Expired entries go when the table is next written.
	later := now.Add(2 * time.Hour)
	a.learn("resp_7", "w", later)
	if a.len() != 1 {
		t.Fatalf("len %d after expiry, want 1", a.len())
	}
	a.learn(string(make([]byte, maxResponseIDLen+1)), "w", later)
	if a.len() != 1 {
		t.Fatal("an oversized id was remembered")
	}
}

func TestFindResponseID(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"id":"resp_abc","object":"response"}`, "resp_abc"},
		{`{"object":"response", "id" : "resp_x1"}`, "resp_x1"},
		{"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_9\",\"output\":[]}}", "resp_9"},
		{`{"output":[{"id":"msg_1"}],"id":"resp_2"}`, "resp_2"},
		{`{"previous_response_id":"resp_old","id":"resp_new"}`, "resp_new"},
		{`{"text":"\"id\":\"resp_forged\"","id":"resp_real"}`, "resp_real"},
		{`{"id":"resp_incompl`, ""},
		{`{"id":"chatcmpl-1"}`, ""},
	} {
		got, ok := findResponseID([]byte(tc.in))
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("findResponseID(%q) = %q, %v; want %q", tc.in, got, ok, tc.want)
		}
	}
}
