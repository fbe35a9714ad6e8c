package remote

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// After a leader change, the first Route goes to the old leader (now a
// follower that forwards it); its answer names the new leader, and the
// very next Route goes there directly, without waiting for a sync.
func TestRouteAnswerSwitchesToNewLeader(t *testing.T) {
	oldLeader, newLeader := newFakeCP(t), newFakeCP(t)
	oldLeader.set(func(f *fakeCP) {
		f.syncResp = &cartv1.SyncResponse{Workers: []*cartv1.Worker{{Url: wA, Healthy: true}}, LeaderId: "n1", LeaderUrl: oldLeader.url}
	})
	r := newTestRouter(t, Options{ControlPlanes: []string{oldLeader.url, newLeader.url}, BootWorkers: boot})
	r.target = 0
	if err := r.SyncOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	askOnce(t, r)
	if oldLeader.routeCount() != 1 || newLeader.routeCount() != 0 {
		t.Fatalf("before the change: old leader saw %d routes, new %d", oldLeader.routeCount(), newLeader.routeCount())
	}
	// Leadership moves: the old leader forwards, and the answer carries
	// the deciding leader's URL.
	oldLeader.set(func(f *fakeCP) {
		f.routeFn = func(*cartv1.RouteRequest) *cartv1.RouteResponse {
			return &cartv1.RouteResponse{Worker: wA, Reason: "cache_miss", FromLeader: true, LeaderId: "n2", LeaderUrl: newLeader.url}
		}
	})
	askOnce(t, r) // the one forwarded call
	for range 3 {
		askOnce(t, r)
	}
	if oldLeader.routeCount() != 2 || newLeader.routeCount() != 3 {
		t.Fatalf("after the change: old leader (forwarding) saw %d routes, new leader %d; want 2, 3", oldLeader.routeCount(), newLeader.routeCount())
	}
}

// A node that cannot forward (a loop, a leader it cannot reach) names the
// leader in its NotLeader detail: the data plane goes there next rather
// than rotating through the list.
func TestNotLeaderDetailPointsAtLeader(t *testing.T) {
	follower, other, leader := newFakeCP(t), newFakeCP(t), newFakeCP(t)
	e := connect.NewError(connect.CodeUnavailable, errors.New("node n1 is not the leader either"))
	d, err := connect.NewErrorDetail(&cartv1.NotLeader{LeaderId: "n3", LeaderUrl: leader.url})
	if err != nil {
		t.Fatal(err)
	}
	e.AddDetail(d)
	follower.set(func(f *fakeCP) { f.routeErr = e })
	r := newTestRouter(t, Options{ControlPlanes: []string{follower.url, other.url, leader.url}, BootWorkers: boot})
	r.target = 0
	if d := askOnce(t, r); d.Reason != ReasonFallbackLocal {
		t.Fatalf("refused call = %+v, want a local fallback", d)
	}
	if d := askOnce(t, r); !d.FromLeader || leader.routeCount() != 1 || other.routeCount() != 0 {
		t.Fatalf("next call = %+v; leader saw %d, other node %d", d, leader.routeCount(), other.routeCount())
	}
}

// A breaker opened against a slow leader does not outlive it: learning a
// new leader closes it, so the next Route asks the new leader at once
// instead of falling back until the next probe.
func TestNewLeaderResetsCPBreaker(t *testing.T) {
	slow, next := newFakeCP(t), newFakeCP(t)
	slow.set(func(f *fakeCP) {
		f.routeDelay = time.Minute // answers only when the caller gives up
		f.syncResp = &cartv1.SyncResponse{Workers: []*cartv1.Worker{{Url: wA, Healthy: true}}, LeaderId: "n1", LeaderUrl: slow.url}
	})
	var fb fallbacks
	// A route timeout generous enough for a first connection to the new
	// leader on a loaded machine; the slow one never answers anyway.
	r := newTestRouter(t, Options{ControlPlanes: []string{slow.url}, RouteTimeout: 300 * time.Millisecond, BootWorkers: boot,
		RouteBreakerFailures: 2, RouteBreakerCooloff: time.Hour, Now: newFakeClock().now, OnFallback: fb.on})
	if err := r.SyncOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		askOnce(t, r)
	}
	if d := askOnce(t, r); d.Reason != ReasonFallbackLocal || lastCause(&fb) != CauseCPBreaker {
		t.Fatalf("breaker did not open: %+v, causes %v", d, fb.list())
	}
	// Leadership moved: the slow node now forwards Sync to the new leader.
	slow.set(func(f *fakeCP) {
		f.syncResp = &cartv1.SyncResponse{Workers: []*cartv1.Worker{{Url: wA, Healthy: true}}, LeaderId: "n2", LeaderUrl: next.url}
	})
	if err := r.SyncOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := askOnce(t, r); !d.FromLeader || next.routeCount() != 1 {
		t.Fatalf("after the new leader was learned: %+v (new leader saw %d routes)", d, next.routeCount())
	}
}

// Sync reports the Route latency of the window since the last sync, for
// the leader's slow-leader handover: calls that timed out count as the
// time they waited, and the breaker's state travels too.
func TestSyncReportsRouteLatency(t *testing.T) {
	cp := newFakeCP(t)
	// Generous, so that answered calls on a loaded machine stay answers.
	const timeout = 500 * time.Millisecond
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, RouteTimeout: timeout, BootWorkers: boot,
		RouteBreakerFailures: 3, RouteBreakerCooloff: time.Hour, Now: newFakeClock().now})
	for range 9 {
		askOnce(t, r)
	}
	cp.set(func(f *fakeCP) { f.routeDelay = time.Minute })
	askOnce(t, r) // times out: the slowest tenth
	if err := r.SyncOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	s := cp.syncRequests()[0]
	if s.GetRouteCalls() != 10 || s.GetRouteTarget() != cp.url || s.GetRouteBreakerOpen() {
		t.Fatalf("first sync = %v", s)
	}
	// Nearest-rank p90 of ten calls is the ninth fastest, an answered one.
	if p90 := time.Duration(s.GetRouteP90Micros()) * time.Microsecond; p90 <= 0 || p90 >= timeout {
		t.Fatalf("p90 = %v, want an answered call's latency", p90)
	}
	for range 2 {
		askOnce(t, r) // both time out: the breaker opens
	}
	if err := r.SyncOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	s = cp.syncRequests()[1]
	if s.GetRouteCalls() != 2 || !s.GetRouteBreakerOpen() || time.Duration(s.GetRouteP90Micros())*time.Microsecond < timeout {
		t.Fatalf("second sync = %v, want 2 timed-out calls and the breaker open", s)
	}
	// A window without calls reports none.
	if err := r.SyncOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := cp.syncRequests()[2]; s.GetRouteCalls() != 0 || s.GetRouteP90Micros() != 0 {
		t.Fatalf("third sync = %v", s)
	}
}

func TestRouteLatencyWindow(t *testing.T) {
	var l routeLatency
	if target, calls, p90 := l.take(); target != "" || calls != 0 || p90 != 0 {
		t.Fatalf("empty window = %q %d %d", target, calls, p90)
	}
	for i := range 100 {
		l.add("a", time.Duration(i+1)*time.Millisecond)
	}
	if target, calls, p90 := l.take(); target != "a" || calls != 100 || p90 != 90_000 {
		t.Fatalf("window = %q %d %d, want a 100 90000", target, calls, p90)
	}
	// Calls to another node start the window over.
	l.add("a", time.Second)
	l.add("b", time.Millisecond)
	if target, calls, p90 := l.take(); target != "b" || calls != 1 || p90 != 1000 {
		t.Fatalf("window after a target change = %q %d %d", target, calls, p90)
	}
	// Bounded: the oldest samples are overwritten.
	for range maxLatencySamples {
		l.add("a", time.Second)
	}
	for range maxLatencySamples {
		l.add("a", time.Millisecond)
	}
	if _, calls, p90 := l.take(); calls != maxLatencySamples || p90 != 1000 {
		t.Fatalf("full window = %d calls, p90 %d", calls, p90)
	}
}
