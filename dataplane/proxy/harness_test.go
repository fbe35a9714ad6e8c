package proxy_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
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

// holdThen makes b hold every request, after a send on entered (room for
// n), until release is closed or the request ends, and then answer with
// next.
func (b *backend) holdThen(next http.HandlerFunc, n int) (entered <-chan struct{}, release chan struct{}) {
	in := make(chan struct{}, n)
	release = make(chan struct{})
	b.set(func(w http.ResponseWriter, r *http.Request) {
		in <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		next(w, r)
	})
	return in, release
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
	return newWiredRig(t, urls, defaultWiring(), opts...)
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

// dialFront opens a raw connection to the proxy, for requests an
// http.Client would not send; it is closed when the test ends, and every
// read and write on it fails after d (no bound when 0).
func dialFront(t testing.TB, front string, d time.Duration) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(front, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if d > 0 {
		_ = conn.SetDeadline(time.Now().Add(d))
	}
	return conn
}

// readResponse reads one answer and its whole body from conn.
func readResponse(t *testing.T, conn net.Conn) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func longText(seed string, n int) string {
	var sb bytes.Buffer
	for sb.Len() < n {
		fmt.Fprintf(&sb, "%s-%d ", seed, sb.Len())
	}
	return sb.String()[:n]
}
