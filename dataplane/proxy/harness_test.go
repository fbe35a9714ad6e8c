package proxy_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/dataplane/breaker"
	"github.com/cartrouter/cart/dataplane/metrics"
	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/dataplane/router"
)

// backend is a scriptable fake replica that records what it received.
type backend struct {
	*httptest.Server
	name    string
	hits    atomic.Int64
	mu      sync.Mutex
	handler http.HandlerFunc // nil: answer a small chat completion
}

func newBackend(t *testing.T, name string) *backend {
	t.Helper()
	b := &backend{name: name}
	b.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			w.WriteHeader(http.StatusOK)
			return
		}
		b.hits.Add(1)
		b.mu.Lock()
		h := b.handler
		b.mu.Unlock()
		if h != nil {
			h(w, r)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi from %s"}}],"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12,"prompt_tokens_details":{"cached_tokens":0}}}`, name)
	}))
	t.Cleanup(b.Close)
	return b
}

func (b *backend) set(h http.HandlerFunc) {
	b.mu.Lock()
	b.handler = h
	b.mu.Unlock()
}

type rig struct {
	t       testing.TB
	router  *router.Local
	breaks  *breaker.Set
	metrics *metrics.Metrics
	proxy   *proxy.Proxy
	front   *httptest.Server
}

type rigOpt func(*proxy.Options, *engine.Policy, []engine.WorkerSpec)

func defaultOptions() proxy.Options {
	return proxy.Options{
		BlockChars:        64,
		MaxBodyBytes:      1 << 20,
		ConnectTimeout:    time.Second,
		RequestTimeout:    10 * time.Second,
		StreamIdleTimeout: 10 * time.Second,
		MaxRetries:        2,
		InitialBackoff:    time.Millisecond,
		MaxBackoff:        10 * time.Millisecond,
		BackoffMultiplier: 2,
		JitterFactor:      0.1,
		RetryableStatuses: []int{408, 429, 500, 502, 503, 504},
		RetryBudgetRatio:  0.2,
		RetryBudgetMin:    3,
		ModelsCacheTTL:    10 * time.Minute,

		PassThroughPaths:          config.DefaultPassThroughPaths,
		RetryablePassThroughPaths: config.DefaultPassThroughPaths,
	}
}

func defaultPolicy() engine.Policy {
	return engine.Policy{Threshold: 0.3, MatchAbsThreshold: 8192, BalanceAbsThreshold: 64, BalanceRelThreshold: 1.5, BlockChars: 64}
}

func newRig(t testing.TB, urls []string, opts ...rigOpt) *rig {
	t.Helper()
	o := defaultOptions()
	pol := defaultPolicy()
	specs := make([]engine.WorkerSpec, len(urls))
	for i, u := range urls {
		specs[i] = engine.WorkerSpec{URL: u}
	}
	for _, f := range opts {
		f(&o, &pol, specs)
	}
	r := &rig{t: t}
	r.router = router.NewLocal(router.LocalOptions{Policy: pol, MaxEntries: 1 << 16, CleanupHour: -1, Seed: 1}, specs)
	r.metrics = metrics.New(func() (int, uint64, uint64, uint64) {
		st, u := r.router.IndexStats()
		return st.Entries, st.Evicted, st.SkippedInserts, u
	})
	r.breaks = breaker.NewSet(breaker.Config{Enabled: true, FailureThreshold: 3, SuccessThreshold: 1, Timeout: time.Minute}, nil)
	o.Router, o.Breakers, o.Metrics = r.router, r.breaks, r.metrics
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	r.proxy = proxy.New(o)
	r.front = httptest.NewServer(r.proxy)
	t.Cleanup(r.front.Close)
	return r
}

func chatBody(system, user string, stream bool) string {
	b, _ := json.Marshal(map[string]any{
		"model":  "m",
		"stream": stream,
		"messages": []map[string]string{
			{"role": "system", "content": system},
			{"role": "user", "content": user},
		},
	})
	return string(b)
}

func (r *rig) post(path, body string, hdr ...string) *http.Response {
	r.t.Helper()
	req, err := http.NewRequest(http.MethodPost, r.front.URL+path, strings.NewReader(body))
	if err != nil {
		r.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	return resp
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// totalLoad sums the router's in-flight counts.
func (r *rig) totalLoad() int {
	n := 0
	for _, w := range r.router.Workers() {
		n += w.Load
	}
	return n
}

// waitLoadZero waits for every decision to be settled (bodies are closed
// asynchronously after the client finishes reading).
func (r *rig) waitLoadZero() {
	r.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if r.totalLoad() == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.t.Fatalf("load did not return to 0: %+v", r.router.Workers())
}

func longText(seed string, n int) string {
	var sb bytes.Buffer
	for sb.Len() < n {
		fmt.Fprintf(&sb, "%s-%d ", seed, sb.Len())
	}
	return sb.String()[:n]
}
