package testkit

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestPostJSONSendsBodyAndHeaders(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Seen", r.Method+" "+r.Header.Get("Content-Type")+" "+r.Header.Get("X-A")+" "+r.Header.Get("X-B"))
		w.WriteHeader(http.StatusTeapot)
		_, _ = w.Write(b)
	}))
	defer srv.Close()
	resp, body, err := PostJSON(t, srv.URL, `{"k":1}`, "X-A", "1", "X-B", "2")
	if err != nil || resp.StatusCode != http.StatusTeapot || body != `{"k":1}` {
		t.Fatalf("status %d body %q err %v", resp.StatusCode, body, err)
	}
	if got := resp.Header.Get("X-Seen"); got != "POST application/json 1 2" {
		t.Fatalf("server saw %q", got)
	}
}
