package remote

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cartrouter/cart/dataplane/router"
	"github.com/cartrouter/cart/internal/testkit"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// breakerTimeout is the route timeout of these tests: long enough that an
// answered call fits in it under -race on a loaded 2-core box (100 ms did
// not: 158 ms seen), short enough to keep the stalled calls quick.
const breakerTimeout = 300 * time.Millisecond

func breakerRouter(t *testing.T, cp *fakeCP, failures int, clock *fakeClock, fb *fallbacks) (*Router, *sentRoutes) {
	// Calls are counted as the router sends them: a call the route timeout
	// cancels may never reach the fake control plane on a loaded machine,
	// and what the breaker decides is whether a call is made at all.
	sent := &sentRoutes{next: testkit.H2CClient().Transport}
	hc := &http.Client{Transport: sent}
	t.Cleanup(hc.CloseIdleConnections)
	return newTestRouter(t, Options{ControlPlanes: []string{cp.url}, RouteTimeout: breakerTimeout, HTTPClient: hc,
		BootWorkers:          []router.WorkerStatus{{URL: wA, Healthy: true}, {URL: wB, Healthy: true}},
		RouteBreakerFailures: failures, RouteBreakerCooloff: time.Second, Now: clock.now, OnFallback: fb.on}), sent
}

// sentRoutes counts the Route calls a router sends.
type sentRoutes struct {
	next http.RoundTripper
	n    atomic.Int64
}

func (s *sentRoutes) RoundTrip(req *http.Request) (*http.Response, error) {
	if strings.HasSuffix(req.URL.Path, "/Route") {
		s.n.Add(1)
	}
	return s.next.RoundTrip(req)
}

func (s *sentRoutes) count() int { return int(s.n.Load()) }

// CloseIdleConnections lets the client's cleanup reach the transport.
func (s *sentRoutes) CloseIdleConnections() {
	if c, ok := s.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

func askOnce(t *testing.T, r *Router) router.Decision {
	t.Helper()
	d, err := r.Decide(context.Background(), &router.Request{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	r.Done(d, router.Outcome{Delivered: true})
	return d
}

func lastCause(fb *fallbacks) string {
	l := fb.list()
	if len(l) == 0 {
		return ""
	}
	return l[len(l)-1]
}

// A stalled control plane costs the route timeout only until the breaker
// opens; then decisions are local at once, one probe goes per cool-off,
// and the first answer closes the breaker.
func TestCPBreakerOpensProbesAndCloses(t *testing.T) {
	cp := newFakeCP(t)
	cp.set(func(f *fakeCP) { f.routeDelay = time.Minute }) // stalls until the caller gives up
	clock, fb := newFakeClock(), &fallbacks{}
	r, sent := breakerRouter(t, cp, 3, clock, fb)

	for i := range 3 {
		if d := askOnce(t, r); d.Reason != ReasonFallbackLocal || lastCause(fb) != "timeout" {
			t.Fatalf("call %d: %+v, cause %q; want a timeout fallback", i, d, lastCause(fb))
		}
	}
	testkit.WaitFor(t, 5*time.Second, "3 Route calls sent", func() bool { return sent.count() == 3 })

	for i := range 5 {
		start := time.Now()
		d := askOnce(t, r)
		if took := time.Since(start); took >= breakerTimeout {
			t.Fatalf("open breaker: call %d took %v, the route timeout is %v", i, took, breakerTimeout)
		}
		if d.Reason != ReasonFallbackLocal || lastCause(fb) != CauseCPBreaker {
			t.Fatalf("open breaker: call %d: %+v, cause %q", i, d, lastCause(fb))
		}
	}
	if n := sent.count(); n != 3 {
		t.Fatalf("open breaker still called the control plane: %d calls, want 3", n)
	}

	// After the cool-off one probe goes; it stalls too, so the breaker
	// stays open for another cool-off.
	clock.advance(time.Second)
	if d := askOnce(t, r); d.Reason != ReasonFallbackLocal || lastCause(fb) != "timeout" {
		t.Fatalf("probe: %+v, cause %q; want a timeout fallback", d, lastCause(fb))
	}
	testkit.WaitFor(t, 5*time.Second, "the probe sent", func() bool { return sent.count() == 4 })
	clock.advance(999 * time.Millisecond)
	if d := askOnce(t, r); d.Reason != ReasonFallbackLocal || lastCause(fb) != CauseCPBreaker {
		t.Fatalf("after a failed probe: %+v, cause %q; want the breaker", d, lastCause(fb))
	}

	// The control plane recovers: the next probe gets its answer, and
	// the breaker closes.
	cp.set(func(f *fakeCP) { f.routeDelay = 0 })
	clock.advance(time.Millisecond)
	for i := range 3 {
		if d := askOnce(t, r); d.Reason != "cache_miss" || d.Worker != wA {
			t.Fatalf("after recovery: call %d: %+v, want the control plane's answer", i, d)
		}
	}
	if n := sent.count(); n != 7 {
		t.Fatalf("control plane saw %d calls, want 7", n)
	}
}

// Refused connections open it like timeouts do.
func TestCPBreakerOpensOnUnavailable(t *testing.T) {
	fb := &fallbacks{}
	r := newTestRouter(t, Options{ControlPlanes: []string{downURL(t)}, BootWorkers: []router.WorkerStatus{{URL: wA, Healthy: true}},
		RouteBreakerFailures: 2, RouteBreakerCooloff: time.Second, Now: newFakeClock().now, OnFallback: fb.on})
	for range 4 {
		askOnce(t, r)
	}
	if got, want := fb.list(), []string{"unavailable", "unavailable", CauseCPBreaker, CauseCPBreaker}; !slices.Equal(got, want) {
		t.Fatalf("fallback causes %v, want %v", got, want)
	}
}

// A control plane that answers with an error answered: it does not open
// the breaker, and it resets the count of consecutive failures.
func TestCPBreakerIgnoresAnswers(t *testing.T) {
	cp := newFakeCP(t)
	clock, fb := newFakeClock(), &fallbacks{}
	r, sent := breakerRouter(t, cp, 3, clock, fb)
	exhausted := connect.NewError(connect.CodeResourceExhausted, errors.New("no worker can take it"))
	cp.set(func(f *fakeCP) { f.routeErr = exhausted })
	for i := range 6 {
		if _, err := r.Decide(context.Background(), &router.Request{Model: "m"}); !errors.Is(err, router.ErrUnavailable) {
			t.Fatalf("call %d: %v, want the control plane's ResourceExhausted", i, err)
		}
	}
	// Two timeouts, an answer, two timeouts: never three in a row.
	for _, stall := range []bool{true, true, false, true, true} {
		cp.set(func(f *fakeCP) {
			f.routeErr = nil
			if stall {
				f.routeDelay = time.Minute
			} else {
				f.routeDelay = 0
			}
		})
		askOnce(t, r)
	}
	testkit.WaitFor(t, 5*time.Second, "all 11 Route calls sent", func() bool { return sent.count() == 11 })
	if slices.Contains(fb.list(), CauseCPBreaker) {
		t.Fatalf("breaker opened: causes %v", fb.list())
	}
}

// 0 failures disables it: every call goes to the control plane.
func TestCPBreakerDisabled(t *testing.T) {
	cp := newFakeCP(t)
	cp.set(func(f *fakeCP) { f.routeDelay = time.Minute })
	fb := &fallbacks{}
	r, sent := breakerRouter(t, cp, 0, newFakeClock(), fb)
	for range 6 { // more than the default of 5, should 0 be mistaken for unset
		askOnce(t, r)
	}
	testkit.WaitFor(t, 5*time.Second, "6 Route calls sent", func() bool { return sent.count() == 6 })
	if slices.Contains(fb.list(), CauseCPBreaker) {
		t.Fatalf("disabled breaker opened: causes %v", fb.list())
	}
}

// With a slowed leader, the breaker removes the route timeout from almost
// every request while keeping the fallback's cache awareness. Opening
// takes five rounds of the 16 clients' calls (a stall counts once), about
// 80 requests that wait out the timeout: 1,600 requests make that the
// small part it is over any outage longer than a moment.
func TestCPBreakerCutsSlowLeaderLatency(t *testing.T) {
	before := runFaultWith(t, "slow", true, 0, 1600)
	after := runFaultWith(t, "slow", true, 5, 1600)
	bm, bp := before.latency()
	am, ap := after.latency()
	t.Logf("slow control plane, Route latency: without breaker mean %v p99 %v (%v); with breaker mean %v p99 %v (%v)",
		bm.Round(time.Microsecond), bp.Round(time.Microsecond), before, am.Round(time.Microsecond), ap.Round(time.Microsecond), after)
	if am*4 > bm {
		t.Fatalf("breaker did not cut the mean added latency: %v without, %v with", bm, am)
	}
	if after.hits*100 < after.repeats*65 {
		t.Fatalf("breaker lost cache awareness: %v", after)
	}
}

// A breaker opened by calls that were refused at once (a dead node, a
// follower with no leader during an election) probes again after
// fastProbe, not after the whole cool-off: a refusal cost nothing to wait
// for, and the next probe may find the new leader. Timeouts keep the
// cool-off.
func TestCPBreakerProbesSoonAfterRefusals(t *testing.T) {
	clock := newFakeClock()
	b := newCPBreaker(2, time.Second, clock.now)
	for range 2 {
		ok, c := b.allow()
		if !ok || c.probe {
			t.Fatal("closed breaker refused a call")
		}
		b.done(c, cpRefused)
	}
	if ok, _ := b.allow(); ok {
		t.Fatal("breaker not open after two refusals")
	}
	clock.advance(fastProbe)
	ok, c := b.allow()
	if !ok || !c.probe {
		t.Fatalf("no probe %v after refusals (allow %v, probe %v)", fastProbe, ok, c.probe)
	}
	b.done(c, cpRefused)
	clock.advance(fastProbe - time.Millisecond)
	if ok, _ := b.allow(); ok {
		t.Fatal("probed again before fastProbe")
	}
	clock.advance(time.Millisecond)
	if ok, c = b.allow(); !ok || !c.probe {
		t.Fatal("no second probe after a refused one")
	}
	// A probe that times out waits the whole cool-off again.
	b.done(c, cpFailed)
	clock.advance(time.Second - time.Millisecond)
	if ok, _ := b.allow(); ok {
		t.Fatal("probed before the cool-off after a timeout")
	}
	clock.advance(time.Millisecond)
	if ok, c = b.allow(); !ok || !c.probe {
		t.Fatal("no probe after the cool-off")
	}
	b.done(c, cpAnswered)
	if ok, c := b.allow(); !ok || c.probe {
		t.Fatal("an answer did not close the breaker")
	}
}

// Calls in flight together that time out together are one failure: a
// single stall longer than the route timeout must not open the breaker,
// however many calls it catches. Rounds of calls, each started after the
// previous round failed, still open it.
func TestCPBreakerCountsAStallOnce(t *testing.T) {
	b := newCPBreaker(3, time.Second, newFakeClock().now)
	round := func(n int, outcome int) {
		calls := make([]cpCall, n)
		for i := range calls {
			ok, c := b.allow()
			if !ok {
				t.Fatal("breaker refused a call before opening")
			}
			calls[i] = c
		}
		for _, c := range calls {
			b.done(c, outcome)
		}
	}
	round(50, cpFailed)
	round(50, cpRefused)
	if b.isOpen() {
		t.Fatal("two stalls of 50 calls each opened a breaker that needs 3 failures")
	}
	round(50, cpFailed)
	if !b.isOpen() {
		t.Fatal("a third round of failures did not open it")
	}

	// An answer starts the count again, whatever round it began in.
	b = newCPBreaker(3, time.Second, newFakeClock().now)
	_, early := b.allow()
	round(1, cpFailed)
	round(1, cpFailed)
	b.done(early, cpAnswered)
	round(1, cpFailed)
	round(1, cpFailed)
	if b.isOpen() {
		t.Fatal("failures before an answer still counted")
	}

	// A call to the old leader that fails after a leader change does not
	// count against the new one.
	b = newCPBreaker(2, time.Second, newFakeClock().now)
	_, toOld := b.allow()
	b.reset()
	b.done(toOld, cpFailed)
	round(1, cpFailed)
	if b.isOpen() {
		t.Fatal("a failure of a call to the previous leader counted")
	}
	// Nor does a probe sent to the previous leader while the breaker was
	// open.
	clock := newFakeClock()
	b = newCPBreaker(2, time.Second, clock.now)
	round(1, cpFailed)
	round(1, cpFailed)
	clock.advance(time.Second)
	ok, probe := b.allow()
	if !ok || !probe.probe {
		t.Fatal("no probe after the cool-off")
	}
	b.reset()
	b.done(probe, cpFailed)
	round(1, cpFailed)
	if b.isOpen() {
		t.Fatal("a probe of the previous leader counted against the new one")
	}
}

// done says when an answer closed an open breaker (the stream then
// redials at once), and probeSoon lets a probe go before the cool-off
// ends (a stream came back: its leader answered).
func TestCPBreakerReportsClosingAndProbesSoon(t *testing.T) {
	clock := newFakeClock()
	b := newCPBreaker(1, time.Second, clock.now)
	_, c := b.allow()
	if b.done(c, cpAnswered) {
		t.Fatal("an answer to a closed breaker reported closing it")
	}
	_, c = b.allow()
	b.done(c, cpFailed)
	if !b.isOpen() {
		t.Fatal("not open after a failure")
	}
	if ok, _ := b.allow(); ok {
		t.Fatal("a call went through an open breaker before its cool-off")
	}
	b.probeSoon()
	ok, probe := b.allow()
	if !ok || !probe.probe {
		t.Fatal("no probe right after probeSoon")
	}
	b.probeSoon() // a probe in flight: no second one
	if ok, _ := b.allow(); ok {
		t.Fatal("probeSoon let a second probe through while one was in flight")
	}
	if !b.done(probe, cpAnswered) || b.isOpen() {
		t.Fatal("the answered probe did not report closing the breaker")
	}
	var none *cpBreaker
	none.probeSoon()
	if none.done(cpCall{}, cpAnswered) || none.probeEvery() != 0 {
		t.Fatal("a disabled breaker reported something")
	}
}
