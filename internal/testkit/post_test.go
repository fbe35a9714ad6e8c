package testkit

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// echoServer answers 418 with the request's body, and in X-Seen its
// method, Content-Type and the headers X-A and X-B (the value trimmed,
// as headers are).
func echoServer(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Seen", r.Method+" "+r.Header.Get("Content-Type")+" "+r.Header.Get("X-A")+" "+r.Header.Get("X-B"))
		w.WriteHeader(http.StatusTeapot)
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestPostJSONSendsBodyAndHeaders(t *testing.T) {
	srv := echoServer(t)
	resp, body, err := PostJSON(t, srv.URL, `{"k":1}`, "X-A", "1", "X-B", "2")
	if err != nil || resp.StatusCode != http.StatusTeapot || body != `{"k":1}` {
		t.Fatalf("status %d body %q err %v", resp.StatusCode, body, err)
	}
	if got := resp.Header.Get("X-Seen"); got != "POST application/json 1 2" {
		t.Fatalf("server saw %q", got)
	}
}

func TestDoSendsTheMethodAndTypesOnlyABody(t *testing.T) {
	srv := echoServer(t)
	resp, _, err := Do(t, http.MethodGet, srv.URL, "", "X-A", "1")
	if err != nil || resp.Header.Get("X-Seen") != "GET  1" {
		t.Fatalf("empty GET: server saw %q (err %v), want no Content-Type", resp.Header.Get("X-Seen"), err)
	}
	resp, body, err := Do(t, http.MethodPut, srv.URL, `{"k":2}`)
	if err != nil || body != `{"k":2}` || resp.Header.Get("X-Seen") != "PUT application/json" {
		t.Fatalf("PUT: server saw %q, body %q (err %v)", resp.Header.Get("X-Seen"), body, err)
	}
}
