package proxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/cartrouter/cart/controlplane/decider"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/dataplane/breaker"
	"github.com/cartrouter/cart/dataplane/metrics"
	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/dataplane/router"
	"github.com/cartrouter/cart/internal/testkit"
)

// wiring is what newWiredRig sets up beyond newRig: the breaker
// configuration, breaker transitions reported to the metrics the way the
// server does, and an injectable clock.
type wiring struct {
	breaker breaker.Config
	now     func() time.Time
	// wrap, when set, stands between the proxy and the rig's router: a
	// test's recorder sees every call the proxy makes.
	wrap func(router.Router) router.Router
	// flow configures the router's flow control (the zero value: on, with
	// its defaults).
	flow decider.FlowOptions
}

func defaultWiring() wiring {
	return wiring{breaker: breaker.Config{Enabled: true, FailureThreshold: 3, SuccessThreshold: 1, Timeout: time.Minute}}
}

// newWiredRig is newRig with wiring.
func newWiredRig(t testing.TB, urls []string, w wiring, opts ...rigOpt) *rig {
	t.Helper()
	o := defaultOptions()
	pol := defaultPolicy()
	specs := make([]engine.WorkerSpec, len(urls))
	for i, u := range urls {
		specs[i] = engine.WorkerSpec{URL: u}
	}
	// Before the options, so a test may give the proxy its own logger.
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, f := range opts {
		f(&o, &pol, specs)
	}
	r := &rig{t: t}
	r.router = router.NewLocal(router.LocalOptions{Policy: pol, MaxEntries: 1 << 16, CleanupHour: -1, Seed: 1, Now: w.now, Flow: w.flow}, specs)
	r.metrics = metrics.New(func() (int, uint64, uint64, uint64) {
		st, u := r.router.IndexStats()
		return st.Entries, st.Evicted, st.SkippedInserts, u
	})
	for _, u := range urls {
		r.metrics.SetBreaker(u, "closed")
	}
	r.breaks = breaker.NewSet(w.breaker, func(tr breaker.Transition) {
		r.metrics.SetBreaker(tr.Worker, tr.To.String())
		r.metrics.BreakerTrans.WithLabelValues(tr.Worker, tr.To.String()).Inc()
	})
	o.Router, o.Breakers, o.Metrics = r.router, r.breaks, r.metrics
	if w.wrap != nil {
		o.Router = w.wrap(r.router)
	}
	if w.now != nil {
		o.Now = w.now
	}
	r.proxy = proxy.New(o)
	r.front = httptest.NewServer(r.proxy)
	t.Cleanup(r.front.Close)
	return r
}

// wrapped is the default wiring with wrap between the proxy and its router.
func wrapped(wrap func(router.Router) router.Router) wiring {
	w := defaultWiring()
	w.wrap = wrap
	return w
}

// logsTo makes the proxy log JSON lines to logs.
func logsTo(logs *testkit.SyncBuffer) rigOpt {
	return func(o *proxy.Options, _ *engine.Policy, _ []engine.WorkerSpec) {
		o.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	}
}

// rigWithOpenBreaker returns a rig on a, which answers 503, and b, tried
// in that order, once three requests have opened a's breaker, with the
// clock the rig runs on.
func rigWithOpenBreaker(t *testing.T) (a, b *backend, r *rig, clock *fakeClock) {
	t.Helper()
	a, b = newBackend(t, "a"), newBackend(t, "b")
	a.set(answer503("a"))
	clock = &fakeClock{}
	w := defaultWiring()
	w.now = clock.now
	r = newWiredRig(t, []string{a.URL, b.URL}, w, preferOrder(10))
	for i := range 3 {
		readAll(t, r.post("/v1/chat/completions", chatBody("s", fmt.Sprint("q", i), false)))
	}
	if got := r.workerViews()[a.URL].BreakerState; got != "open" {
		t.Fatalf("a's breaker %q, want open", got)
	}
	return a, b, r, clock
}

// preferOrder makes the router try workers in the given order on a cache
// miss: worker i gets load penalty i*step, so it is the least loaded once
// the ones before it are excluded. step must exceed the load a test puts on
// any one worker.
func preferOrder(step int) rigOpt {
	return func(_ *proxy.Options, _ *engine.Policy, s []engine.WorkerSpec) {
		for i := range s {
			s[i].LoadPenalty = i * step
		}
	}
}

func withOptions(f func(*proxy.Options)) rigOpt {
	return func(o *proxy.Options, _ *engine.Policy, _ []engine.WorkerSpec) { f(o) }
}

// answer503 is a replica that is up but refuses work.
func answer503(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"error":{"message":"overloaded `+name+`","type":"server_error"}}`)
	}
}

// hangUntilGone never answers: it waits for the request to be cancelled (or
// the test to end) and reports when it saw the cancellation.
func hangUntilGone(stop <-chan struct{}, cancelled chan<- time.Time) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// The server notices a closed connection only once the body is read.
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
			if cancelled != nil {
				select {
				case cancelled <- time.Now():
				default:
				}
			}
		case <-stop:
		}
	}
}

// streamUntilGone streams chunk after chunk, pause apart, until the
// request is cancelled or stop is closed.
func streamUntilGone(stop <-chan struct{}, chunk string, pause time.Duration) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for {
			if _, err := io.WriteString(w, chunk); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-stop:
				return
			case <-time.After(pause):
			}
		}
	}
}

// oneEventThenWait streams one event and then waits for the request to be
// cancelled or release to be closed.
func oneEventThenWait(release <-chan struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}
}

// stopChan is closed when the test ends, to release handlers that wait.
func stopChan(t *testing.T) chan struct{} {
	c := make(chan struct{})
	t.Cleanup(func() { close(c) })
	return c
}

// workerView fetches GET /workers.
func (r *rig) workerViews() map[string]proxy.WorkerView {
	r.t.Helper()
	resp, err := http.Get(r.front.URL + "/workers")
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct{ Workers []proxy.WorkerView }
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		r.t.Fatal(err)
	}
	out := make(map[string]proxy.WorkerView, len(body.Workers))
	for _, w := range body.Workers {
		out[w.URL] = w
	}
	return out
}

// postCtx sends a chat request with ctx and returns the response or error.
func (r *rig) postCtx(ctx context.Context, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.front.URL+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return http.DefaultClient.Do(req)
}

// streaming posts a streamed chat request and returns its answer once the
// first line has arrived, and the cancel that hangs the client up.
func (r *rig) streaming(t *testing.T, body string) (*http.Response, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	resp, err := r.postCtx(ctx, body)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	return resp, cancel
}

// timedPost posts a chat request and reads its answer, reporting how long
// that took; 10 s bound it, should the timeout under test fail.
func (r *rig) timedPost(t *testing.T, body string) (*http.Response, string, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	resp, err := r.postCtx(ctx, body)
	if err != nil {
		t.Fatalf("after %v: %v", time.Since(start), err)
	}
	got := readAll(t, resp)
	return resp, got, time.Since(start)
}

// fakeClock is a settable clock for Options.Now.
type fakeClock struct{ off atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *fakeClock) advance(d time.Duration) { c.off.Add(int64(d)) }

// blackholeAddr returns a 127.0.0.1 address whose TCP handshake never
// completes: a listening socket with backlog 0 that never accepts, with its
// accept queue filled, so the kernel drops further SYNs.
func blackholeAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			_ = c.Close()
		}
	})
	for range 32 {
		c, err := net.DialTimeout("tcp", addr, 150*time.Millisecond)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return addr // the queue is full: handshakes now hang
			}
			t.Fatalf("filling the accept queue: %v", err)
		}
		conns = append(conns, c)
	}
	t.Skip("could not fill the accept queue of a backlog-0 listener; SYNs are not dropped here")
	return ""
}

// silentTLSAddr returns the address of a TCP listener that accepts and then
// never says a word: a TLS handshake against it hangs.
func silentTLSAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
	})
	return ln.Addr().String()
}

// closedURL is the URL of a port nobody listens on (connection refused).
func closedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return "http://" + addr
}

// assertNoDoubleRelease checks that no routing decision was released twice.
func assertNoDoubleRelease(t *testing.T, r *rig) {
	t.Helper()
	if v := counterValue(t, r, "cart_load_release_underflows_total", ""); v != 0 {
		t.Fatalf("load release underflows = %v: some decision was released twice", v)
	}
}

// newFlowRig is newRig with the router's flow control configured.
func newFlowRig(t testing.TB, urls []string, flow decider.FlowOptions, opts ...rigOpt) *rig {
	t.Helper()
	w := defaultWiring()
	w.flow = flow
	return newWiredRig(t, urls, w, opts...)
}
