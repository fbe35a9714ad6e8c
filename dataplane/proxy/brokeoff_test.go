package proxy_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/cartrouter/cart/internal/testkit"
)

// "response body broke off" is a warning about a worker: a client that
// hangs up mid-answer ends the upstream read too (its context closes the
// worker's connection, read as an i/o timeout) and must not raise it; a
// worker that cuts its answer must.
func TestBrokeOffWarnsOfWorkersNotClients(t *testing.T) {
	const chunk = "data: {\"choices\":[{\"delta\":{\"content\":\"tok\"}}]}\n\n"
	for range 5 { // the hang-up races the next upstream chunk: try it a few times
		var logs testkit.SyncBuffer
		a := newBackend(t, "a")
		a.set(streamUntilGone(stopChan(t), chunk, 0))
		r := newRig(t, []string{a.URL}, logsTo(&logs))
		resp, cancel := r.streaming(t, chatBody("s", "endless", true))
		cancel()
		resp.Body.Close()
		r.waitLoadZero()
		if strings.Contains(logs.String(), "broke off") {
			t.Fatalf("a client's hang-up logged as the worker's fault:\n%s", logs.String())
		}
	}

	var logs testkit.SyncBuffer
	b := newBackend(t, "b")
	b.set(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, chunk)
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the worker dies mid-answer
	})
	r := newRig(t, []string{b.URL}, logsTo(&logs))
	resp := r.post("/v1/chat/completions", chatBody("s", "cut", true))
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	r.waitLoadZero()
	if !strings.Contains(logs.String(), "response body broke off") {
		t.Fatalf("a worker that cut its answer was not logged:\n%s", logs.String())
	}
}
