package remote

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/service"
	"github.com/cartrouter/cart/dataplane/router"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
	"github.com/cartrouter/cart/internal/testkit"
)

// Route, Complete and Sync go over the stream to a real leader once it is
// live, with the same answers as the unary calls, and no unary call.
func TestStreamRoundTrip(t *testing.T) {
	cp := newOneNodeCP(t, service.AuthOptions{Token: "tok"})
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, Token: "tok", RouteStream: true, FlushInterval: 5 * time.Millisecond})
	run(t, r)
	streamLive(t, r, cp.url)
	if err := r.SyncOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ws := r.Workers(); len(ws) != 2 {
		t.Fatalf("workers after a streamed sync: %v", ws)
	}
	before := cp.paths.count(cartv1connect.RouterServiceRouteProcedure)
	var fb fallbacks
	r.o.OnFallback = fb.on
	req := &router.Request{Model: "m", Hashes: []uint64{1, 2, 3}, KeyLen: 192}
	d, err := r.Decide(context.Background(), req)
	if err != nil || !d.FromLeader || d.Ticket.ID == 0 || (d.Worker != wA && d.Worker != wB) {
		t.Fatalf("streamed route: %+v %v", d, err)
	}
	d2, err := r.Decide(context.Background(), req)
	if err != nil || d2.Worker != d.Worker || d2.Reason != "cache_hit" {
		t.Fatalf("second streamed route: %+v %v; want a cache hit on %s", d2, err, d.Worker)
	}
	if n := cp.paths.count(cartv1connect.RouterServiceRouteProcedure) - before; n != 0 || len(fb.list()) != 0 {
		t.Fatalf("%d unary Route calls and fallbacks %v while the stream was live", n, fb.list())
	}
	if got := streamFallbacks(t, r, "route"); got != 0 {
		t.Fatalf("stream fallbacks counted for route: %v", got)
	}
	r.Done(d, router.Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1})
	r.Done(d2, router.Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1})
	testkit.WaitFor(t, 5*time.Second, "completions settled over the stream", func() bool { return cp.dec.Stats().Unsettled == 0 })
	if n := cp.paths.count(cartv1connect.RouterServiceCompleteProcedure); n != 0 {
		t.Fatalf("%d unary Complete calls while the stream was live", n)
	}
	if got := gaugeValue(t, r.streams.open); got != 1 {
		t.Fatalf("cart_route_stream_open = %v, want 1", got)
	}
	if n := cp.paths.count(cartv1connect.RouterServiceStreamProcedure); n != 1 {
		t.Fatalf("%d streams opened, want 1", n)
	}
}

// Many concurrent routes share the stream and each gets its own answer,
// whatever order they are answered in.
func TestStreamMultiplexesConcurrentRoutes(t *testing.T) {
	cp, _ := newStreamCP(t)
	var n sync.Mutex
	delay := 0
	cp.hold = func(*cartv1.StreamRequest) {
		n.Lock()
		delay = (delay + 7) % 5
		d := time.Duration(delay) * time.Millisecond
		n.Unlock()
		time.Sleep(d) // answers out of order
	}
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, RouteStream: true, RouteTimeout: 10 * time.Second})
	run(t, r)
	streamLive(t, r, cp.url)
	const calls = 200
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for i := range calls {
		wg.Go(func() {
			id := fmt.Sprintf("req-%d", i)
			d, err := r.Decide(context.Background(), &router.Request{ID: id, DryRun: true})
			if err != nil || d.Worker != id {
				errs <- fmt.Errorf("%s: answered %q (%v)", id, d.Worker, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := cp.calls.Load(); got != calls {
		t.Fatalf("%d calls reached the stream, want %d", got, calls)
	}
}

// No more than RouteStreamMaxInFlight calls are in flight on the stream.
func TestStreamFlowControlBound(t *testing.T) {
	cp, _ := newStreamCP(t)
	cp.hold = func(*cartv1.StreamRequest) { time.Sleep(5 * time.Millisecond) }
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, RouteStream: true, RouteStreamMaxInFlight: 4, RouteTimeout: 10 * time.Second})
	run(t, r)
	streamLive(t, r, cp.url)
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			id := fmt.Sprint(i)
			if d, err := r.Decide(context.Background(), &router.Request{ID: id, DryRun: true}); err != nil || d.Worker != id {
				t.Errorf("route %d: %+v %v", i, d, err)
			}
		})
	}
	wg.Wait()
	if got := cp.maxFly.Load(); got != 4 {
		t.Fatalf("at most %d calls in flight on the stream, want the bound, 4", got)
	}
}

// A call that cannot get a slot before its route timeout times out like
// a unary call (local fallback, cause timeout) without reaching the leader.
func TestStreamCallBlockedPastDeadlineTimesOut(t *testing.T) {
	cp, _ := newStreamCP(t)
	release := make(chan struct{})
	cp.hold = func(m *cartv1.StreamRequest) {
		if m.GetSync() != nil {
			select {
			case <-release:
			case <-cp.kill:
			}
		}
	}
	var fb fallbacks
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, RouteStream: true, RouteStreamMaxInFlight: 1,
		RouteTimeout: 50 * time.Millisecond, OnFallback: fb.on})
	run(t, r)
	streamLive(t, r, cp.url)
	syncDone := make(chan error, 1)
	go func() { syncDone <- r.SyncOnce(context.Background()) }() // takes the only slot
	testkit.WaitFor(t, 5*time.Second, "sync held by the leader", func() bool { return cp.inFly.Load() == 1 })
	d, err := r.Decide(context.Background(), &router.Request{ID: "late"})
	if err != nil || d.Reason != ReasonFallbackLocal {
		t.Fatalf("blocked route: %+v %v; want a local fallback", d, err)
	}
	if got := fb.list(); len(got) != 1 || got[0] != "timeout" {
		t.Fatalf("fallback causes %v, want [timeout]", got)
	}
	if got := cp.calls.Load(); got != 1 {
		t.Fatalf("%d calls reached the leader, want only the sync", got)
	}
	close(release)
	if err := <-syncDone; err != nil {
		t.Fatal(err)
	}
}

// A control plane without the Stream RPC (Unimplemented) is used through
// the unary calls, counted as stream fallbacks.
func TestStreamUnimplementedFallsBackToUnary(t *testing.T) {
	cp := newFakeCP(t)
	pc := &pathCounter{next: cp.srv.Config.Handler}
	cp.srv.Config.Handler = pc
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, RouteStream: true})
	run(t, r)
	testkit.WaitFor(t, 10*time.Second, "two stream attempts", func() bool { return pc.count(cartv1connect.RouterServiceStreamProcedure) >= 2 })
	if r.streams.live("") != nil {
		t.Fatal("a stream is live against a control plane without Stream")
	}
	d, err := r.Decide(context.Background(), &router.Request{ID: "x"})
	if err != nil || !d.FromLeader || d.Worker != wA {
		t.Fatalf("route: %+v %v; want the leader's unary answer", d, err)
	}
	if got := streamFallbacks(t, r, "route"); got != 1 {
		t.Fatalf("route stream fallbacks %v, want 1", got)
	}
}

// Over a client that speaks only HTTP/1.1 the stream cannot open, and
// every call goes unary.
func TestStreamHTTP1OnlyFallsBackToUnary(t *testing.T) {
	cp, pc := newStreamCP(t)
	c := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(c.CloseIdleConnections)
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, RouteStream: true, HTTPClient: c})
	run(t, r)
	testkit.WaitFor(t, 10*time.Second, "two stream attempts", func() bool { return pc.count(cartv1connect.RouterServiceStreamProcedure) >= 2 })
	if r.streams.live("") != nil || cp.streams.Load() != 0 {
		t.Fatal("a stream went live over HTTP/1.1")
	}
	d, err := r.Decide(context.Background(), &router.Request{ID: "x"})
	if err != nil || !d.FromLeader {
		t.Fatalf("route over HTTP/1.1: %+v %v; want the leader's unary answer", d, err)
	}
}

// Calls in flight on a stream that breaks fail at once (local fallback,
// not a wait for the route timeout, and no breaker verdict); later calls are answered again (here
// by the unary calls: this leader refuses every stream from then on).
func TestStreamBrokenMidFlight(t *testing.T) {
	cp, _ := newStreamCP(t)
	cp.hold = func(m *cartv1.StreamRequest) {
		if m.GetRoute().GetRequestId() == "held" {
			<-cp.kill
		}
	}
	var fb fallbacks
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, RouteStream: true, RouteTimeout: time.Minute, OnFallback: fb.on,
		RouteBreakerFailures: 1, RouteBreakerCooloff: time.Hour})
	run(t, r)
	streamLive(t, r, cp.url)
	type result struct {
		d   router.Decision
		err error
		at  time.Duration
	}
	start := time.Now()
	res := make(chan result, 1)
	go func() {
		d, err := r.Decide(context.Background(), &router.Request{ID: "held"})
		res <- result{d, err, time.Since(start)}
	}()
	testkit.WaitFor(t, 5*time.Second, "route held on the stream", func() bool { return cp.inFly.Load() == 1 })
	close(cp.kill) // the leader's end of every stream fails
	got := <-res
	if got.err != nil || got.d.Reason != ReasonFallbackLocal || got.at > 30*time.Second {
		t.Fatalf("in-flight route on a broken stream: %+v %v after %v; want a local fallback at once", got.d, got.err, got.at)
	}
	if c := fb.list(); len(c) != 1 || c[0] != "unavailable" {
		t.Fatalf("fallback causes %v, want [unavailable]", c)
	}
	// All calls on a stream fail together when it breaks: one event, which
	// must not open the control-plane breaker (here, at one failure).
	if r.cpb.isOpen() {
		t.Fatal("a broken stream opened the control-plane breaker")
	}
	testkit.WaitFor(t, 10*time.Second, "an answer from the leader after the break", func() bool {
		d, err := r.Decide(context.Background(), &router.Request{ID: "after", DryRun: true})
		return err == nil && d.FromLeader
	})
}

// A stream opened on a follower is refused with the leader's URL, and the
// data plane opens it on the leader; when leadership moves, the stream
// follows it.
func TestStreamFollowerRedirectsToLeader(t *testing.T) {
	nodes := newCPCluster(t, service.HandoverOptions{})
	ld := cpLeader(nodes)
	var follower *cpNode
	for _, x := range nodes {
		if x != ld {
			follower = x
			break
		}
	}
	r := newTestRouter(t, Options{ControlPlanes: []string{follower.url}, BootWorkers: boot, RouteStream: true})
	run(t, r)
	streamLive(t, r, ld.url)
	d, err := r.Decide(context.Background(), &router.Request{ID: "x", DryRun: true})
	if err != nil || !d.FromLeader {
		t.Fatalf("route: %+v %v", d, err)
	}
	// The leader hands over: its stream ends naming the successor, and the
	// data plane reopens it there.
	if _, err := ld.node.TransferLeadership(context.Background(), ""); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "a new leader", func() bool { n := cpLeader(nodes); return n != nil && n != ld })
	streamLive(t, r, cpLeader(nodes).url)
}

// The stream passes the same authentication as the unary calls: without
// the cluster token it never opens.
func TestStreamRefusedWithoutCredential(t *testing.T) {
	cp := newOneNodeCP(t, service.AuthOptions{Token: "tok"})
	bad := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, RouteStream: true})
	run(t, bad)
	testkit.WaitFor(t, 10*time.Second, "two stream attempts", func() bool { return cp.paths.count(cartv1connect.RouterServiceStreamProcedure) >= 2 })
	if bad.streams.live("") != nil {
		t.Fatal("a stream opened without the cluster token")
	}
	good := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, Token: "tok", RouteStream: true})
	run(t, good)
	streamLive(t, good, cp.url)
}

// A stream refused during an election backs off, but once a unary Sync is
// answered (a leader is there) the stream is retried at once instead of
// after a backoff grown through the election.
func TestStreamRetriesWhenALeaderAnswers(t *testing.T) {
	cp, pc := newStreamCP(t)
	cp.electing.Store(true)
	cp.mu.Lock()
	cp.syncErr = connect.NewError(connect.CodeUnavailable, errors.New("no leader"))
	cp.mu.Unlock()
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, RouteStream: true, SyncInterval: 50 * time.Millisecond})
	run(t, r)
	// Attempts at 0, 50, 150, 350, 750, 1550 ms...: the sixth waits 1.6 s.
	testkit.WaitFor(t, 10*time.Second, "the backoff to grow", func() bool { return pc.count(cartv1connect.RouterServiceStreamProcedure) >= 6 })
	cp.electing.Store(false)
	cp.mu.Lock()
	cp.syncErr = nil
	cp.mu.Unlock()
	start := time.Now()
	streamLive(t, r, cp.url)
	if d := time.Since(start); d > time.Second {
		t.Fatalf("the stream came back %v after the leader answered; want within about a sync interval", d)
	}
}

// A data plane with flow control on, on a live stream to a leader that
// does not queue (flow control off there, or an older release): a
// saturated pool is a 503 at once. Waiting for a queueing stream that
// will not come would hold every request until its queue deadline.
func TestSaturatedWithoutALeaderQueueIsAnswerAtOnce(t *testing.T) {
	cp, _ := newStreamCP(t)
	cp.routeErr = connect.NewError(connect.CodeResourceExhausted, engine.ErrAllSaturated)
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, RouteStream: true,
		Flow: FlowOptions{On: true, QueueTimeout: 10 * time.Second}})
	run(t, r)
	streamLive(t, r, cp.url)
	if r.streams.live(cp.url).queues {
		t.Fatal("the fake leader declared a queue")
	}
	start := time.Now()
	_, err := r.Decide(context.Background(), &router.Request{Model: "m"})
	if !errors.Is(err, router.ErrUnavailable) {
		t.Fatalf("saturated pool: %v, want unavailable", err)
	}
	if took := time.Since(start); took > 5*time.Second { // the fault waits the 10 s queue timeout
		t.Fatalf("the answer took %v: it waited for a queue the leader does not hold", took)
	}
}
