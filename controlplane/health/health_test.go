package health

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
)

func TestTrackerExactThresholds(t *testing.T) {
	for _, fail := range []int{1, 2, 3} {
		for _, succ := range []int{1, 2, 3} {
			t.Run(fmt.Sprintf("failure=%d,success=%d", fail, succ), func(t *testing.T) {
				tr := NewTracker(Config{FailureThreshold: fail, SuccessThreshold: succ})
				observe := func(ok, wantChanged, wantHealthy bool) {
					t.Helper()
					changed, healthy := tr.Observe("w", ok)
					if changed != wantChanged || healthy != wantHealthy || tr.Healthy("w") != wantHealthy {
						t.Fatalf("Observe(%v) = (%v, %v), Healthy=%v; want (%v, %v)", ok, changed, healthy, tr.Healthy("w"), wantChanged, wantHealthy)
					}
				}
				// One fewer failure than the threshold does not flip it, and a
				// success in between restarts the count.
				for range fail - 1 {
					observe(false, false, true)
				}
				observe(true, false, true)
				for range fail - 1 {
					observe(false, false, true)
				}
				observe(false, true, false) // the threshold-th consecutive failure
				observe(false, false, false)
				// Back: one fewer success does not flip it; a failure restarts.
				for range succ - 1 {
					observe(true, false, false)
				}
				observe(false, false, false)
				for range succ - 1 {
					observe(true, false, false)
				}
				observe(true, true, true) // the threshold-th consecutive success
				observe(true, false, true)
			})
		}
	}
}

func TestTrackerUnknownWorkersStartHealthyAndRetainForgets(t *testing.T) {
	tr := NewTracker(Config{FailureThreshold: 1, SuccessThreshold: 5})
	if !tr.Healthy("never-seen") {
		t.Fatal("an unknown worker must count as healthy")
	}
	tr.Observe("a", false)
	tr.Observe("b", false)
	if tr.Healthy("a") || tr.Healthy("b") {
		t.Fatal("a single failure with threshold 1 did not mark unhealthy")
	}
	tr.Retain(map[string]bool{"b": true})
	if !tr.Healthy("a") {
		t.Fatal("a forgotten worker kept its verdict")
	}
	if tr.Healthy("b") {
		t.Fatal("a retained worker lost its verdict")
	}
}

// fakeWorker serves /health with a status the test controls, and can hang.
type fakeWorker struct {
	*httptest.Server
	status atomic.Int32
	probes atomic.Int64
	hang   chan struct{} // non-nil: probes wait for it (or their context)
}

func newFakeWorker(t *testing.T) *fakeWorker {
	t.Helper()
	f := &fakeWorker{}
	f.status.Store(http.StatusOK)
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			http.NotFound(w, r)
			return
		}
		f.probes.Add(1)
		if f.hang != nil {
			select {
			case <-f.hang:
			case <-r.Context().Done():
				return
			}
		}
		w.WriteHeader(int(f.status.Load()))
	}))
	t.Cleanup(f.Close)
	return f
}

type verdicts struct {
	mu  sync.Mutex
	got []string
}

func (v *verdicts) record(w string, healthy bool, reason string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.got = append(v.got, fmt.Sprintf("%s=%v (%s)", w, healthy, reason))
}

func (v *verdicts) list() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.got...)
}

func TestCheckerRoundAppliesThresholdsBothWays(t *testing.T) {
	a, b := newFakeWorker(t), newFakeWorker(t)
	var v verdicts
	c := NewChecker(Config{Endpoint: "/health", Interval: time.Hour, Timeout: 2 * time.Second, FailureThreshold: 3, SuccessThreshold: 2}, nil, v.record)
	c.SetWorkers([]string{a.URL, b.URL})
	ctx := context.Background()

	b.status.Store(http.StatusServiceUnavailable)
	c.Round(ctx)
	c.Round(ctx)
	if got := v.list(); len(got) != 0 {
		t.Fatalf("verdicts after 2 of 3 failures: %v", got)
	}
	c.Round(ctx)
	got := v.list()
	if len(got) != 1 || !strings.HasPrefix(got[0], b.URL+"=false") || !strings.Contains(got[0], "status 503") {
		t.Fatalf("verdicts after the 3rd failure: %v (want one: b unhealthy, status 503)", got)
	}
	if a.probes.Load() != 3 || b.probes.Load() != 3 {
		t.Fatalf("probes a=%d b=%d, want 3 each", a.probes.Load(), b.probes.Load())
	}

	b.status.Store(http.StatusOK)
	c.Round(ctx)
	if got := v.list(); len(got) != 1 {
		t.Fatalf("b came back after 1 of 2 successes: %v", got)
	}
	c.Round(ctx)
	got = v.list()
	if len(got) != 2 || got[1] != b.URL+"=true (ok)" {
		t.Fatalf("verdicts after the 2nd success: %v", got)
	}
}

// judgeOnce runs one round on url alone, with thresholds of one so that
// the round's probe is the verdict, and returns the verdicts it gave.
func judgeOnce(url string, timeout time.Duration) []string {
	var v verdicts
	c := NewChecker(Config{Endpoint: "/health", Interval: time.Hour, Timeout: timeout, FailureThreshold: 1, SuccessThreshold: 1}, nil, v.record)
	c.SetWorkers([]string{url})
	c.Round(context.Background())
	return v.list()
}

func TestCheckerProbeTimeoutCountsAsFailure(t *testing.T) {
	a := newFakeWorker(t)
	a.hang = make(chan struct{})
	t.Cleanup(func() { close(a.hang) })
	start := time.Now()
	got := judgeOnce(a.URL, 150*time.Millisecond)
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("a hanging probe held the round for %v (timeout 150ms)", d)
	}
	if len(got) != 1 || !strings.HasPrefix(got[0], a.URL+"=false") {
		t.Fatalf("verdicts: %v, want the hanging worker unhealthy", got)
	}
}

func TestCheckerUnreachableWorkerFails(t *testing.T) {
	a := newFakeWorker(t)
	url := a.URL
	a.Close()
	if got := judgeOnce(url, time.Second); len(got) != 1 || !strings.HasPrefix(got[0], url+"=false") {
		t.Fatalf("verdicts: %v, want the closed worker unhealthy", got)
	}
}

// A round cut short by shutdown says nothing about the workers.
func TestCheckerCancelledRoundJudgesNothing(t *testing.T) {
	a := newFakeWorker(t)
	a.hang = make(chan struct{})
	t.Cleanup(func() { close(a.hang) })
	var v verdicts
	c := NewChecker(Config{Endpoint: "/health", Interval: time.Hour, Timeout: 10 * time.Second, FailureThreshold: 1, SuccessThreshold: 1}, nil, v.record)
	c.SetWorkers([]string{a.URL})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Round(ctx) }()
	testkit.WaitFor(t, 10*time.Second, "a.probes.Load() == 1", func() bool { return a.probes.Load() == 1 })
	cancel()
	<-done
	if got := v.list(); len(got) != 0 {
		t.Fatalf("a cancelled round produced verdicts: %v", got)
	}
}

// A worker removed (reload) while its probe is in flight gets no verdict:
// one would recreate its state and its health metric.
func TestCheckerIgnoresWorkerRemovedDuringProbe(t *testing.T) {
	a := newFakeWorker(t)
	a.status.Store(http.StatusInternalServerError)
	a.hang = make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(a.hang) }) }
	t.Cleanup(release)
	var v verdicts
	c := NewChecker(Config{Endpoint: "/health", Interval: time.Hour, Timeout: 10 * time.Second, FailureThreshold: 1, SuccessThreshold: 1}, nil, v.record)
	c.SetWorkers([]string{a.URL})
	done := make(chan struct{})
	go func() { defer close(done); c.Round(context.Background()) }()
	testkit.WaitFor(t, 10*time.Second, "a.probes.Load() == 1", func() bool { return a.probes.Load() == 1 })
	c.SetWorkers(nil)
	release()
	<-done
	if got := v.list(); len(got) != 0 {
		t.Fatalf("verdict for a removed worker: %v", got)
	}
	c.mu.Lock()
	_, tracked := c.tracker.state[a.URL]
	c.mu.Unlock()
	if tracked {
		t.Fatal("the removed worker's state was recreated")
	}
}

func TestCheckerRunProbesEachIntervalUntilCancelled(t *testing.T) {
	a := newFakeWorker(t)
	a.status.Store(http.StatusServiceUnavailable)
	var v verdicts
	c := NewChecker(Config{Endpoint: "/health", Interval: 20 * time.Millisecond, Timeout: 10 * time.Millisecond, FailureThreshold: 3, SuccessThreshold: 1}, nil, v.record)
	c.SetWorkers([]string{a.URL})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	testkit.WaitFor(t, 10*time.Second, "len(v.list()) == 1", func() bool { return len(v.list()) == 1 })
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if n := a.probes.Load(); n < 3 {
		t.Fatalf("unhealthy after %d probes, want at least 3", n)
	}
}

// Probes bypass environment proxies (HTTP_PROXY...), as inference traffic
// does: a proxy that cannot reach the workers would fail every probe and
// take the whole pool out of service.
func TestDefaultClientIgnoresEnvironmentProxy(t *testing.T) {
	c := NewChecker(Config{Endpoint: "/health", Interval: time.Hour, Timeout: time.Second, FailureThreshold: 1, SuccessThreshold: 1}, nil, nil)
	tr, ok := c.client.Transport.(*http.Transport)
	if !ok {
		t.Fatalf("default probe transport is %T", c.client.Transport)
	}
	if tr.Proxy != nil {
		t.Fatal("the default probe client uses a proxy function (HTTP_PROXY would apply)")
	}
}

// A worker started with an API key (vLLM --api-key) answers 401 to an
// anonymous probe; the probe must carry its key or the pool goes down.
func TestCheckerSendsWorkerKey(t *testing.T) {
	var wrong atomic.Int64
	keyed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer wk-1" {
			wrong.Add(1)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(keyed.Close)
	var v verdicts
	cfg := Config{Endpoint: "/health", Interval: time.Hour, Timeout: time.Second, FailureThreshold: 1, SuccessThreshold: 1}
	cfg.WorkerKey = func(w string) string {
		if w == keyed.URL {
			return "wk-1"
		}
		return ""
	}
	c := NewChecker(cfg, nil, v.record)
	c.SetWorkers([]string{keyed.URL})
	c.Round(context.Background())
	if got := v.list(); len(got) != 0 || wrong.Load() != 0 {
		t.Fatalf("verdicts %v, %d probes without the key", got, wrong.Load())
	}
	cfg.WorkerKey = nil
	c = NewChecker(cfg, nil, v.record)
	c.SetWorkers([]string{keyed.URL})
	c.Round(context.Background())
	if got := v.list(); len(got) != 1 || !strings.Contains(got[0], "status 401") {
		t.Fatalf("without a key the keyed worker should fail its probe: %v", got)
	}
}
