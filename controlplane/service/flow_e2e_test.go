package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/dataplane/remote"
	"github.com/cartrouter/cart/dataplane/router"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
)

// addLimitedWorkers adds workers whose engines run n requests at once.
func (cp *testCP) addLimitedWorkers(t testing.TB, n uint32, urls ...string) {
	t.Helper()
	for _, u := range urls {
		cmd := &cartv1.RaftCommand{Body: &cartv1.RaftCommand_UpsertWorker{UpsertWorker: &cartv1.UpsertWorkerCommand{Worker: &cartv1.WorkerSpec{Url: u, MaxConcurrency: n}}}}
		if _, err := cp.node.Apply(context.Background(), cmd); err != nil {
			t.Fatalf("add worker %s: %v", u, err)
		}
	}
}

// flowDataPlane is a real data-plane router on the Route stream, with flow
// control, against cp.
func flowDataPlane(t *testing.T, cp *testCP, id string, fo remote.FlowOptions) *remote.Router {
	t.Helper()
	client := testkit.H2CClient()
	t.Cleanup(client.CloseIdleConnections)
	fo.On = true
	dp := remote.New(remote.Options{
		ID: id, ControlPlanes: []string{cp.url}, RouteTimeout: time.Second,
		SyncInterval: 100 * time.Millisecond, FlushInterval: 5 * time.Millisecond, HTTPClient: client,
		BlockChars: testBlockChars, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		RouteStream: true, Flow: fo,
	})
	if err := dp.SyncOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); dp.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	testkit.WaitFor(t, 5*time.Second, "the route stream open", dp.StreamLive)
	return dp
}

type routed struct {
	d   router.Decision
	err error
}

func routeAsync(dp *remote.Router, ctx context.Context, tenant, text string, prio int) <-chan routed {
	out := make(chan routed, 1)
	go func() {
		d, err := dp.Decide(ctx, &router.Request{Model: "m", Hashes: hashes("m", text), KeyLen: len(text),
			Admission: router.Admission{Tenant: tenant, Label: tenant, Priority: prio, Cost: 10}})
		out <- routed{d, err}
	}()
	return out
}

// One queue for the fleet: two data planes' requests wait in the
// leader's queue while the pool is saturated, leave it in the policy's
// order whichever data plane they came through, and a client that leaves
// while queued takes its request out of the leader's queue.
func TestFleetQueueAcrossDataPlanes(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true})
	cp.addLimitedWorkers(t, 1, w1)
	dp1 := flowDataPlane(t, cp, "dp1", remote.FlowOptions{})
	dp2 := flowDataPlane(t, cp, "dp2", remote.FlowOptions{})

	first := <-routeAsync(dp1, context.Background(), "flood", "busy", 0)
	if first.err != nil {
		t.Fatal(first.err)
	}
	flood := routeAsync(dp1, context.Background(), "flood", "flood 1", 0)
	testkit.WaitFor(t, 5*time.Second, "the flood's request queued", func() bool { return len(cp.dec.Queue().Items) == 1 })
	leaves, leave := context.WithCancel(context.Background())
	gone := routeAsync(dp2, leaves, "calm", "calm leaves", 0)
	vip := routeAsync(dp2, context.Background(), "vip", "vip", 5)
	testkit.WaitFor(t, 5*time.Second, "three queued", func() bool { return len(cp.dec.Queue().Items) == 3 })
	leave()
	if r := <-gone; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("a client that left while queued: %v", r.err)
	}
	testkit.WaitFor(t, 5*time.Second, "its request out of the leader's queue", func() bool { return len(cp.dec.Queue().Items) == 2 })

	// The release goes to the higher priority, through the other data plane.
	dp1.Done(first.d, router.Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1})
	r := <-vip
	if r.err != nil || r.d.Worker != w1 || r.d.Waited <= 0 {
		t.Fatalf("vip: %+v %v", r.d, r.err)
	}
	select {
	case f := <-flood:
		t.Fatalf("the flood's request went before the higher priority was done: %+v", f)
	case <-time.After(50 * time.Millisecond):
	}
	dp2.Done(r.d, router.Outcome{Delivered: true, PromptTokens: 10, CompletionTokens: 5, CachedTokens: -1})
	f := <-flood
	if f.err != nil {
		t.Fatal(f.err)
	}
	dp1.Done(f.d, router.Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1})
	testkit.WaitFor(t, 5*time.Second, "no load or ticket left", func() bool {
		return cp.unsettled() == 0 && cp.loads(t)[w1] == 0 && len(cp.dec.Queue().Items) == 0
	})
}

// A request still queued at its deadline gets the leader's 429 with its
// reason; a sheddable one is refused at once, never queued.
func TestFleetQueueRefusals(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true, dec: func(o *decider.Options) { o.Flow.QueueTimeout = 100 * time.Millisecond }})
	cp.addLimitedWorkers(t, 1, w1)
	dp := flowDataPlane(t, cp, "dp1", remote.FlowOptions{QueueTimeout: 100 * time.Millisecond})
	first := <-routeAsync(dp, context.Background(), "a", "busy", 0)
	if first.err != nil {
		t.Fatal(first.err)
	}
	start := time.Now()
	r := <-routeAsync(dp, context.Background(), "a", "waits", 0)
	var re *router.RefusedError
	if !errors.As(r.err, &re) || re.Reason != router.RefusedTimeout {
		t.Fatalf("queued past the timeout: %v", r.err)
	}
	if time.Since(start) < 100*time.Millisecond {
		t.Fatal("refused before the queue timeout")
	}
	start = time.Now()
	r = <-routeAsync(dp, context.Background(), "batch", "shed me", -1)
	if !errors.As(r.err, &re) || re.Reason != router.RefusedShed {
		t.Fatalf("sheddable on a saturated pool: %v", r.err)
	}
	if time.Since(start) > time.Second {
		t.Fatal("a sheddable request waited")
	}
	dp.Done(first.d, router.Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1})
	testkit.WaitFor(t, 5*time.Second, "no load left", func() bool { return cp.unsettled() == 0 && cp.loads(t)[w1] == 0 })
}

// While no leader answers, a data plane queues locally with the same
// policy, and hands what waits over to the leader when it answers again.
func TestLocalQueueWhileTheLeaderIsAway(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true})
	cp.addLimitedWorkers(t, 1, w1)
	dp := flowDataPlane(t, cp, "dp1", remote.FlowOptions{})
	// The leader goes: every call is refused (not leading).
	cp.dec.Lead(false)
	var wg sync.WaitGroup
	first := <-routeAsync(dp, context.Background(), "a", "local busy", 0)
	if first.err != nil || first.d.FromLeader {
		t.Fatalf("local fallback: %+v %v", first.d, first.err)
	}
	second := routeAsync(dp, context.Background(), "a", "local waits", 0)
	select {
	case r := <-second:
		t.Fatalf("the second request did not wait for the worker at its limit: %+v %v", r.d, r.err)
	case <-time.After(100 * time.Millisecond):
	}
	// Released locally: the waiting one takes the room.
	dp.Done(first.d, router.Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1})
	r := <-second
	if r.err != nil || r.d.Worker != w1 || r.d.FromLeader {
		t.Fatalf("local dispatch: %+v %v", r.d, r.err)
	}
	// A third waits locally, then the leader is back: it is handed over.
	third := routeAsync(dp, context.Background(), "a", "handed over", 0)
	time.Sleep(50 * time.Millisecond)
	cp.dec.Lead(true)
	wg.Wait()
	dp.Done(r.d, router.Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1})
	h := <-third
	if h.err != nil || h.d.Worker != w1 {
		t.Fatalf("handed-over request: %+v %v", h.d, h.err)
	}
	dp.Done(h.d, router.Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1})
	testkit.WaitFor(t, 5*time.Second, "no load left on the leader", func() bool { return cp.unsettled() == 0 && cp.loads(t)[w1] == 0 })
}

// A leader change with requests queued: the old leader answers its queued
// calls (it stopped leading), the data plane asks again, waits locally
// while no leader answers, and hands the requests to the next leader with
// their first arrival; each is dispatched once, none is lost, no load is
// left.
func TestLeaderChangeWithQueuedRequests(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true})
	cp.addLimitedWorkers(t, 1, w1)
	dp := flowDataPlane(t, cp, "dp1", remote.FlowOptions{})
	first := <-routeAsync(dp, context.Background(), "a", "busy", 0)
	if first.err != nil {
		t.Fatal(first.err)
	}
	var waiting []<-chan routed
	for i, tenant := range []string{"a", "b", "c"} {
		waiting = append(waiting, routeAsync(dp, context.Background(), tenant, "queued "+tenant, i))
	}
	testkit.WaitFor(t, 5*time.Second, "three queued at the leader", func() bool { return len(cp.dec.Queue().Items) == 3 })

	// The leader steps down: its queue and streams end, and it answers
	// nothing (no leader) until it leads again.
	cp.node.setLeader(false, "")
	cp.core.OnLeadership(false)
	time.Sleep(200 * time.Millisecond)
	for _, ch := range waiting {
		select {
		case r := <-ch:
			t.Fatalf("a queued request ended while no leader answered: %+v %v", r.d, r.err)
		default:
		}
	}
	// The next leader (this node again, fresh soft state) serves once its
	// term started, as a real one does after its barrier.
	cp.core.OnLeadership(true)
	cp.node.setLeader(true, "n1")
	testkit.WaitForMsg(t, 10*time.Second, "the requests queued at the new leader", func() (bool, string) {
		return len(cp.dec.Queue().Items) == 3, fmt.Sprintf("leader queue %d, load %v, unsettled %d", len(cp.dec.Queue().Items), cp.loads(t), cp.unsettled())
	})
	dp.Done(first.d, router.Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1})
	// The highest priority first, each released before the next goes.
	for want := 2; want >= 0; want-- {
		var got routed
		select {
		case got = <-waiting[want]:
		case <-time.After(10 * time.Second):
			t.Fatalf("priority %d never dispatched", want)
		}
		if got.err != nil || got.d.Worker != w1 || !got.d.FromLeader {
			t.Fatalf("priority %d: %+v %v", want, got.d, got.err)
		}
		for other := range waiting[:want] {
			select {
			case r := <-waiting[other]:
				t.Fatalf("priority %d dispatched while %d held the only slot: %+v", other, want, r.d)
			default:
			}
		}
		dp.Done(got.d, router.Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1})
	}
	testkit.WaitFor(t, 5*time.Second, "no load or ticket left", func() bool {
		return cp.unsettled() == 0 && cp.loads(t)[w1] == 0 && len(cp.dec.Queue().Items) == 0
	})
}
