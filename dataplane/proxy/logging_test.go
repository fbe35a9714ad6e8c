package proxy_test

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/cartrouter/cart/internal/testkit"
)

// loggedProxy is a proxy over urls whose log is kept.
func loggedProxy(t *testing.T, urls []string) (string, *testkit.SyncBuffer) {
	t.Helper()
	logs := &testkit.SyncBuffer{}
	return newRig(t, urls, logsTo(logs)).front.URL, logs
}

// A worker that cannot be reached is logged with its address; the client
// hears only that the upstream is unavailable.
func TestUpstreamErrorsDoNotNameWorkers(t *testing.T) {
	deadURL := closedURL(t)
	dead := strings.TrimPrefix(deadURL, "http://")
	front, logs := loggedProxy(t, []string{deadURL})
	for _, path := range []string{"/v1/chat/completions", "/v1/embeddings"} {
		resp, err := http.Post(front+path, "application/json", strings.NewReader(chatBody("s", "q", false)))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("%s: status %d body %s, want 502", path, resp.StatusCode, body)
		}
		assertOpenAIError(t, string(body), "upstream unavailable")
		_, port, _ := net.SplitHostPort(dead)
		if strings.Contains(string(body), "127.0.0.1") || strings.Contains(string(body), port) || strings.Contains(string(body), "dial") {
			t.Fatalf("%s: error body names the worker: %s", path, body)
		}
	}
	if !strings.Contains(logs.String(), dead) {
		t.Fatalf("the log does not name the unreachable worker %s:\n%s", dead, logs.String())
	}
}

// A client-chosen string (a 60 KB model name) is cut to a bounded size in
// log lines, with a note of how much was cut.
func TestLoggedClientStringsAreTruncated(t *testing.T) {
	a := newBackend(t, "a")
	front, logs := loggedProxy(t, []string{a.URL})
	model := strings.Repeat("m", 60<<10)
	body := `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]}`
	resp, err := http.Post(front+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// A refusal that quotes client input is bounded too.
	resp, err = http.Post(front+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"`+model+`","messages":[{"role":"`+model+`"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	out := logs.String()
	if !strings.Contains(out, `"msg":"route"`) || !strings.Contains(out, "bytes truncated") {
		t.Fatalf("no truncated route line in the log:\n%.2000s", out)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if len(line) > 2048 {
			t.Fatalf("log line of %d bytes: %.300s...", len(line), line)
		}
	}
}
