package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/internal/testkit"
)

// A stream that goes silent for longer than the idle timeout is aborted:
// the client sees its body end with an error about when the timeout
// passes, the replica sees its request cancelled, and the load is released.
func TestStreamStallIsAborted(t *testing.T) {
	a := newBackend(t, "a")
	stop := stopChan(t)
	gone := make(chan time.Time, 1)
	a.set(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"one\"}}]}\n\n")
		w.(http.Flusher).Flush()
		hangUntilGone(stop, gone)(w, r) // then silence
	})
	const idle = 300 * time.Millisecond
	r := newRig(t, []string{a.URL}, withOptions(func(o *proxy.Options) { o.StreamIdleTimeout = idle }))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // bounds the test if the timer fails
	defer cancel()
	resp, err := r.postCtx(ctx, chatBody("s", "stream", true))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.Contains(line, "one") {
		t.Fatalf("first chunk: %q %v", line, err)
	}
	start := time.Now()
	rest, err := io.ReadAll(br)
	elapsed := time.Since(start)
	if err == nil {
		t.Fatalf("the stalled stream ended cleanly after %v: %q", elapsed, rest)
	}
	if elapsed < idle/2 || elapsed > 3*time.Second {
		t.Fatalf("stream cut after %v, want about the idle timeout (%v)", elapsed, idle)
	}
	select {
	case <-gone:
	case <-time.After(5 * time.Second):
		t.Fatal("the replica's request was not cancelled")
	}
	r.waitLoadZero()
	testkit.WaitFor(t, 5*time.Second, "cart_worker_in_flight == 0", func() bool { return counterValue(t, r, "cart_worker_in_flight", "") == 0 })
}

// Neither timeout cuts a long stream that keeps sending: the idle timer
// measures silence, not the stream's length, and the request timeout
// bounds the wait for headers only. Each stream lasts several times
// longer than the timeout under test.
func TestSteadyStreamIsNotCut(t *testing.T) {
	cases := []struct {
		name   string
		chunks int
		opt    func(*proxy.Options)
	}{
		{"stream idle timeout", 8, func(o *proxy.Options) { o.StreamIdleTimeout = 400 * time.Millisecond }},
		{"request timeout", 6, func(o *proxy.Options) { o.RequestTimeout = 200 * time.Millisecond }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := newBackend(t, "a")
			a.set(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(http.StatusOK)
				w.(http.Flusher).Flush()
				for i := range tc.chunks {
					fmt.Fprintf(w, "data: {\"n\":%d}\n\n", i)
					w.(http.Flusher).Flush()
					time.Sleep(100 * time.Millisecond)
				}
				fmt.Fprint(w, "data: [DONE]\n\n")
			})
			r := newRig(t, []string{a.URL}, withOptions(tc.opt))
			resp := r.post("/v1/chat/completions", chatBody("s", "stream", true))
			if body := readAll(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(body, "[DONE]") {
				t.Fatalf("%d %q", resp.StatusCode, body)
			}
			r.waitLoadZero()
		})
	}
}

// A replica that never sends response headers gets a 504 in the OpenAI
// error shape after the request timeout (retries included), and the load
// is released.
func TestRequestTimeoutGives504(t *testing.T) {
	a := newBackend(t, "a")
	stop := stopChan(t)
	a.set(hangUntilGone(stop, nil))
	const timeout = 300 * time.Millisecond
	r := newRig(t, []string{a.URL}, withOptions(func(o *proxy.Options) { o.RequestTimeout = timeout }))
	resp, body, elapsed := r.timedPost(t, chatBody("s", "q", false))
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("status %d body %s, want 504", resp.StatusCode, body)
	}
	assertOpenAIError(t, body, "in time")
	if elapsed < timeout || elapsed > 3*time.Second {
		t.Fatalf("504 after %v, want about the request timeout %v", elapsed, timeout)
	}
	r.waitLoadZero()
	if v := counterValue(t, r, "cart_requests_total", `status="5xx"`); v != 1 {
		t.Fatalf("cart_requests_total{5xx} = %v", v)
	}
}
