package proxy_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/dataplane/proxy"
)

// A retryable status on A is retried on B, which serves the request; A saw
// exactly one attempt.
func TestRetryableStatusRetriedOnAnotherReplica(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	a.set(answer503("a"))
	r := newRig(t, []string{a.URL, b.URL}, preferOrder(10), withOptions(func(o *proxy.Options) { o.AddRoutedPeerHeader = true }))
	resp := r.post("/v1/chat/completions", chatBody("s", "q", false))
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "hi from b") {
		t.Fatalf("status %d body %s, want 200 from b", resp.StatusCode, body)
	}
	if got := resp.Header.Get(proxy.HeaderRoutedPeer); got != b.URL {
		t.Fatalf("routed peer %q, want b (%s)", got, b.URL)
	}
	if a.hits.Load() != 1 || b.hits.Load() != 1 {
		t.Fatalf("attempts a=%d b=%d, want 1 and 1", a.hits.Load(), b.hits.Load())
	}
	if v := counterValue(t, r, "cart_retries_total", ""); v != 1 {
		t.Fatalf("cart_retries_total = %v, want 1", v)
	}
	if v := counterValue(t, r, "cart_requests_total", `status="2xx",tenant="anonymous",worker="`+b.URL+`"`); v != 1 {
		t.Fatalf("request not recorded as 2xx served by b: %v", v)
	}
	r.waitLoadZero()
	assertNoDoubleRelease(t, r)
}

// Connection errors (refused, or the connection dropped before an answer)
// are retried on another replica.
func TestConnectionErrorRetriedOnAnotherReplica(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		b := newBackend(t, "b")
		dead := closedURL(t)
		r := newRig(t, []string{dead, b.URL}, preferOrder(10))
		resp := r.post("/v1/chat/completions", chatBody("s", "q", false))
		body := readAll(t, resp)
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, "hi from b") {
			t.Fatalf("status %d body %s", resp.StatusCode, body)
		}
		if b.hits.Load() != 1 {
			t.Fatalf("b attempts %d", b.hits.Load())
		}
		r.waitLoadZero()
	})
	t.Run("dropped before answering", func(t *testing.T) {
		a, b := newBackend(t, "a"), newBackend(t, "b")
		a.set(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			panic(http.ErrAbortHandler) // the server drops the connection
		})
		r := newRig(t, []string{a.URL, b.URL}, preferOrder(10))
		resp := r.post("/v1/chat/completions", chatBody("s", "q", false))
		body := readAll(t, resp)
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, "hi from b") {
			t.Fatalf("status %d body %s", resp.StatusCode, body)
		}
		if a.hits.Load() != 1 || b.hits.Load() != 1 {
			t.Fatalf("attempts a=%d b=%d, want 1 and 1", a.hits.Load(), b.hits.Load())
		}
		r.waitLoadZero()
	})
}

// Every replica that failed the request is excluded from its later
// attempts: with three replicas of which two fail, the third serves it.
// The penalties make C the last choice by load, so only the exclusion of A
// and B can bring the request there.
func TestRetryExcludesEveryFailedReplica(t *testing.T) {
	a, b, c := newBackend(t, "a"), newBackend(t, "b"), newBackend(t, "c")
	a.set(answer503("a"))
	b.set(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		http.Error(w, "bad gateway", http.StatusBadGateway)
	})
	r := newRig(t, []string{a.URL, b.URL, c.URL},
		func(_ *proxy.Options, _ *engine.Policy, s []engine.WorkerSpec) {
			s[0].LoadPenalty, s[1].LoadPenalty, s[2].LoadPenalty = 0, 1, 50
		})
	resp := r.post("/v1/chat/completions", chatBody("s", "q", false))
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "hi from c") {
		t.Fatalf("status %d body %s, want 200 from c", resp.StatusCode, body)
	}
	if a.hits.Load() != 1 || b.hits.Load() != 1 || c.hits.Load() != 1 {
		t.Fatalf("attempts a=%d b=%d c=%d, want 1 each", a.hits.Load(), b.hits.Load(), c.hits.Load())
	}
	r.waitLoadZero()
	assertNoDoubleRelease(t, r)
}

// Once a response byte has reached the client there is no retry: a
// replica that sends 200 and part of a stream and then dies leaves the
// client with a truncated response, and no other replica is tried.
func TestNoRetryOnceResponseStarted(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	a.set(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"partial\"}}]}\n\n")
		w.(http.Flusher).Flush()
		time.Sleep(20 * time.Millisecond) // let the chunk reach the client first
		panic(http.ErrAbortHandler)       // the replica dies mid-stream
	})
	r := newRig(t, []string{a.URL, b.URL}, preferOrder(10))
	resp := r.post("/v1/chat/completions", chatBody("s", "stream", true))
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	got, err := io.ReadAll(resp.Body)
	if err == nil {
		t.Fatalf("the truncated stream ended cleanly: %q", got)
	}
	if !strings.Contains(string(got), "partial") {
		t.Fatalf("the bytes sent before the failure did not reach the client: %q (err %v)", got, err)
	}
	if strings.Contains(string(got), "hi from b") {
		t.Fatalf("b's answer was spliced into a started stream: %q", got)
	}
	if b.hits.Load() != 0 {
		t.Fatalf("b got %d attempts after the response had started", b.hits.Load())
	}
	if v := counterValue(t, r, "cart_retries_total", ""); v != 0 {
		t.Fatalf("cart_retries_total = %v", v)
	}
	r.waitLoadZero()
}

// A 4xx answer is the client's problem: it is passed through, not retried.
func TestClientErrorStatusNotRetried(t *testing.T) {
	for _, status := range []int{400, 404, 422} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			a, b := newBackend(t, "a"), newBackend(t, "b")
			a.set(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.WriteHeader(status)
				_, _ = io.WriteString(w, `{"error":{"message":"bad from a","type":"invalid_request_error"}}`)
			})
			r := newRig(t, []string{a.URL, b.URL}, preferOrder(10))
			resp := r.post("/v1/chat/completions", chatBody("s", "q", false))
			body := readAll(t, resp)
			if resp.StatusCode != status || !strings.Contains(body, "bad from a") {
				t.Fatalf("status %d body %s, want a's %d", resp.StatusCode, body, status)
			}
			if a.hits.Load() != 1 || b.hits.Load() != 0 {
				t.Fatalf("attempts a=%d b=%d, want 1 and 0", a.hits.Load(), b.hits.Load())
			}
			if st := r.breaks.State(a.URL); st.String() != "closed" {
				t.Fatalf("a client error counted against the replica's breaker: %s", st)
			}
			r.waitLoadZero()
		})
	}
}

// max_retries bounds the attempts; when they run out the client gets the
// last replica's own answer.
func TestMaxRetriesBoundsAttempts(t *testing.T) {
	for _, maxRetries := range []int{0, 1, 3} {
		t.Run(fmt.Sprint(maxRetries), func(t *testing.T) {
			var backends []*backend
			var urls []string
			for i := range 5 {
				b := newBackend(t, fmt.Sprint(i))
				b.set(answer503(fmt.Sprint(i)))
				backends = append(backends, b)
				urls = append(urls, b.URL)
			}
			r := newRig(t, urls, withOptions(func(o *proxy.Options) { o.MaxRetries = maxRetries }))
			resp := r.post("/v1/chat/completions", chatBody("s", "q", false))
			body := readAll(t, resp)
			if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "overloaded") {
				t.Fatalf("status %d body %s, want a replica's own 503", resp.StatusCode, body)
			}
			total := int64(0)
			for _, b := range backends {
				if b.hits.Load() > 1 {
					t.Fatalf("replica %s tried %d times", b.name, b.hits.Load())
				}
				total += b.hits.Load()
			}
			if total != int64(maxRetries+1) {
				t.Fatalf("%d attempts with max_retries %d, want %d", total, maxRetries, maxRetries+1)
			}
			r.waitLoadZero()
			assertNoDoubleRelease(t, r)
		})
	}
}

// When every replica has failed and retries remain, the client still gets
// the last replica's own answer, not a generic "no worker available".
func TestRetriesExhaustedOnReplicasDeliverLastAnswer(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	a.set(answer503("a"))
	b.set(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Retry-After", "7")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, `{"error":{"message":"rate limited by b","type":"rate_limit_error"}}`)
	})
	r := newRig(t, []string{a.URL, b.URL}, preferOrder(10)) // max_retries 2 > replicas-1
	resp := r.post("/v1/chat/completions", chatBody("s", "q", false))
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, "rate limited by b") || resp.Header.Get("Retry-After") != "7" {
		t.Fatalf("status %d body %s retry-after %q, want b's own 429", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
	if a.hits.Load() != 1 || b.hits.Load() != 1 {
		t.Fatalf("attempts a=%d b=%d", a.hits.Load(), b.hits.Load())
	}
	r.waitLoadZero()
	assertNoDoubleRelease(t, r)
}

// The delay between attempts grows by the multiplier and is capped at the
// maximum (jitter off; the bounds leave room for a slow machine).
func TestRetryBackoffGrowsAndIsCapped(t *testing.T) {
	var mu sync.Mutex
	var at []time.Time
	var urls []string
	for i := range 4 {
		b := newBackend(t, fmt.Sprint(i))
		b.set(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			at = append(at, time.Now())
			mu.Unlock()
			answer503("")(w, r)
		})
		urls = append(urls, b.URL)
	}
	r := newRig(t, urls, withOptions(func(o *proxy.Options) {
		o.MaxRetries = 3
		o.InitialBackoff = 60 * time.Millisecond
		o.BackoffMultiplier = 4
		o.MaxBackoff = 200 * time.Millisecond
		o.JitterFactor = 0
	}))
	resp := r.post("/v1/chat/completions", chatBody("s", "q", false))
	readAll(t, resp)
	mu.Lock()
	defer mu.Unlock()
	if len(at) != 4 {
		t.Fatalf("%d attempts, want 4", len(at))
	}
	gaps := []time.Duration{at[1].Sub(at[0]), at[2].Sub(at[1]), at[3].Sub(at[2])}
	t.Logf("gaps between attempts: %v", gaps)
	// Expected 60ms, 200ms (240 capped), 200ms (960 capped).
	if gaps[0] < 60*time.Millisecond {
		t.Errorf("first backoff %v < initial 60ms", gaps[0])
	}
	if gaps[1] < 200*time.Millisecond {
		t.Errorf("second backoff %v did not grow (want >= 200ms)", gaps[1])
	}
	if gaps[2] < 200*time.Millisecond || gaps[2] > 800*time.Millisecond {
		t.Errorf("third backoff %v, want capped at ~200ms (uncapped it would be 960ms)", gaps[2])
	}
}

// The buffered request body is replayed byte for byte on the retry, also
// when the client sent it chunked (no Content-Length).
func TestRetryReplaysBodyIdentically(t *testing.T) {
	for _, chunked := range []bool{false, true} {
		t.Run(fmt.Sprintf("chunked=%v", chunked), func(t *testing.T) {
			var gotA, gotB []byte
			a, b := newBackend(t, "a"), newBackend(t, "b")
			a.set(func(w http.ResponseWriter, r *http.Request) {
				gotA, _ = io.ReadAll(r.Body)
				w.WriteHeader(http.StatusServiceUnavailable)
			})
			b.set(func(w http.ResponseWriter, r *http.Request) {
				gotB, _ = io.ReadAll(r.Body)
				_, _ = io.WriteString(w, `{"ok":true}`)
			})
			r := newRig(t, []string{a.URL, b.URL}, preferOrder(10))
			sent := []byte(chatBody(longText("system ünïcode ", 5000), "the question\n\t\"quoted\"", false))
			var rd io.Reader = bytes.NewReader(sent)
			if chunked {
				rd = io.MultiReader(bytes.NewReader(sent[:100]), bytes.NewReader(sent[100:])) // unknown length
			}
			req, _ := http.NewRequest(http.MethodPost, r.front.URL+"/v1/chat/completions", rd)
			if chunked && req.ContentLength != 0 {
				t.Fatal("request would not be sent chunked")
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			readAll(t, resp)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if !bytes.Equal(gotA, sent) {
				t.Fatalf("first attempt body differs: %d bytes vs %d sent", len(gotA), len(sent))
			}
			if !bytes.Equal(gotB, sent) {
				t.Fatalf("retried body differs: %d bytes vs %d sent", len(gotB), len(sent))
			}
			r.waitLoadZero()
		})
	}
}

// A connect timeout fails fast and the request moves on: with one replica
// whose handshake never completes and a healthy one, the request succeeds
// via retry far sooner than the request timeout.
func TestConnectTimeoutFailsFast(t *testing.T) {
	cases := map[string]func(t *testing.T) string{
		"tcp handshake never completes": func(t *testing.T) string { return "http://" + blackholeAddr(t) },
		"tls handshake never completes": func(t *testing.T) string { return "https://" + silentTLSAddr(t) },
	}
	for name, deadURL := range cases {
		t.Run(name, func(t *testing.T) {
			dead := deadURL(t)
			b := newBackend(t, "b")
			r := newRig(t, []string{dead, b.URL}, preferOrder(10), withOptions(func(o *proxy.Options) {
				o.ConnectTimeout = 200 * time.Millisecond
				o.RequestTimeout = 30 * time.Second
			}))
			resp, body, elapsed := r.timedPost(t, chatBody("s", "q", false))
			if resp.StatusCode != http.StatusOK || !strings.Contains(body, "hi from b") {
				t.Fatalf("status %d body %s", resp.StatusCode, body)
			}
			if elapsed > 2*time.Second {
				t.Fatalf("took %v with a 200ms connect timeout (request timeout 30s)", elapsed)
			}
			if elapsed < 200*time.Millisecond {
				t.Fatalf("took %v: the dead replica was not tried first", elapsed)
			}
			if v := counterValue(t, r, "cart_retries_total", ""); v != 1 {
				t.Fatalf("cart_retries_total = %v, want 1", v)
			}
			r.waitLoadZero()
		})
	}
}

// The retry budget caps a retry storm: with every replica failing and many
// concurrent requests, upstream attempts stay close to the request count,
// whereas without a budget every request makes max_retries+1 attempts.
func TestRetryBudgetCapsStorm(t *testing.T) {
	const n = 60
	run := func(t *testing.T, ratio float64, minimum int) (attempts int64, exhausted float64) {
		var arrived atomic.Int64
		gate := make(chan struct{})
		var gateOnce sync.Once
		open := func() { gateOnce.Do(func() { close(gate) }) }
		var urls []string
		for i := range 3 {
			b := newBackend(t, fmt.Sprint(i))
			b.set(func(w http.ResponseWriter, r *http.Request) {
				// Hold the first attempts until all n are in flight, so they
				// fail together as in a real outage.
				if k := arrived.Add(1); k <= n {
					if k == n {
						open()
					}
					<-gate
				}
				answer503("")(w, r)
			})
			urls = append(urls, b.URL)
		}
		t.Cleanup(open) // before the backends close, which waits for their handlers
		r := newRig(t, urls, withOptions(func(o *proxy.Options) {
			o.MaxRetries = 2
			o.RetryBudgetRatio, o.RetryBudgetMin = ratio, minimum
		}))
		var wg sync.WaitGroup
		var not503 atomic.Int64
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := r.postCtx(context.Background(), chatBody("s", fmt.Sprint("storm ", i), false))
				if err != nil {
					not503.Add(1)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusServiceUnavailable {
					not503.Add(1)
				}
			}()
		}
		wg.Wait()
		if not503.Load() != 0 {
			t.Fatalf("%d requests did not get the replicas' 503", not503.Load())
		}
		r.waitLoadZero()
		return arrived.Load(), counterValue(t, r, "cart_retry_budget_exhausted_total", "")
	}

	var budgeted, unbounded int64
	t.Run("budget 0.2", func(t *testing.T) {
		var exhausted float64
		budgeted, exhausted = run(t, 0.2, 3)
		// At most ratio*n retries are in progress at once while all n are
		// in flight, each making at most max_retries attempts.
		bound := int64(n + 2*12)
		t.Logf("attempts %d for %d requests (bound %d), budget exhausted %v times", budgeted, n, bound, exhausted)
		if budgeted > bound {
			t.Fatalf("%d upstream attempts for %d requests, want <= %d", budgeted, n, bound)
		}
		if exhausted == 0 {
			t.Fatal("cart_retry_budget_exhausted_total stayed 0 during a storm")
		}
	})
	t.Run("budget off", func(t *testing.T) {
		var exhausted float64
		unbounded, exhausted = run(t, 1, 1000)
		t.Logf("attempts %d for %d requests without a budget", unbounded, n)
		if unbounded != 3*n {
			t.Fatalf("%d attempts without a budget, want %d (every request tries all 3 replicas)", unbounded, 3*n)
		}
		if exhausted != 0 {
			t.Fatalf("budget exhausted %v times with the budget off", exhausted)
		}
	})
	if budgeted >= unbounded {
		t.Fatalf("the budget did not reduce attempts: %d vs %d", budgeted, unbounded)
	}
}
