package remote

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cartrouter/cart/controlplane/cpclient"
	"github.com/cartrouter/cart/dataplane/router"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
)

var boot = []router.WorkerStatus{{URL: wA, Healthy: true}, {URL: wB, Healthy: true}}

func TestRouteViaControlPlane(t *testing.T) {
	cp := newFakeCP(t)
	cp.set(func(f *fakeCP) {
		f.routeFn = func(*cartv1.RouteRequest) *cartv1.RouteResponse {
			return &cartv1.RouteResponse{Worker: wA, Reason: "cache_hit", MatchedChars: 64, MatchedRatio: 0.5, Candidate: wA,
				ChosenChars: 64, Ticket: 42, FromLeader: true, LeaderId: "n1", DecisionMicros: 3}
		}
	})
	var fb fallbacks
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, Token: "tok", OnFallback: fb.on})
	req := &router.Request{ID: "req-1", Endpoint: "chat_completions", Model: "m", Hashes: []uint64{1, 2, 3}, KeyLen: 150, Exclude: []string{wB}}
	d, err := r.Decide(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if d.Worker != wA || d.Reason != "cache_hit" || d.MatchedChars != 64 || d.MatchedRatio != 0.5 || d.Candidate != wA ||
		d.ChosenChars != 64 || !d.FromLeader || d.Latency <= 0 {
		t.Fatalf("decision = %+v", d)
	}
	if tk := d.Ticket; tk.ID != 42 || tk.Worker != wA {
		t.Fatalf("ticket = %#v", d.Ticket)
	}
	got := cp.lastRoute()
	if got.GetDataplaneId() != "dp-test" || got.GetRequestId() != "req-1" || got.GetEndpoint() != "chat_completions" || got.GetModel() != "m" ||
		!slices.Equal(got.GetBlockHashes(), []uint64{1, 2, 3}) || got.GetKeyLength() != 150 || !slices.Equal(got.GetExcludeWorkers(), []string{wB}) || got.GetDryRun() {
		t.Fatalf("RouteRequest sent = %v", got)
	}
	cp.mu.Lock()
	auth := cp.auth[len(cp.auth)-1]
	cp.mu.Unlock()
	if auth != "Bearer tok" {
		t.Fatalf("Authorization = %q", auth)
	}
	if l := loadOf(r, wA); l != 1 {
		t.Fatalf("local load after Route = %d, want 1", l)
	}
	if len(fb.list()) != 0 {
		t.Fatalf("fallback on success: %v", fb.list())
	}

	r.Done(d, router.Outcome{Delivered: true, PromptTokens: 100, CachedTokens: 64})
	if l := loadOf(r, wA); l != 0 {
		t.Fatalf("local load after Done = %d, want 0", l)
	}
	// A second Done (a caller bug) must not drive the count negative.
	r.Done(d, router.Outcome{Delivered: true, PromptTokens: 100, CachedTokens: 64})
	if l := loadOf(r, wA); l != 0 {
		t.Fatalf("local load after a second Done = %d, want 0", l)
	}
	// A decision with a zero ticket (nothing was routed) is ignored.
	r.Done(router.Decision{Worker: wA}, router.Outcome{})

	run(t, r)
	testkit.WaitFor(t, 5*time.Second, "completion flushed", func() bool { _, all := cp.completions(); return len(all) >= 1 })
	cp.mu.Lock()
	first := cp.completes[0]
	cp.mu.Unlock()
	c := first.GetCompletions()[0]
	if first.GetDataplaneId() != "dp-test" || c.GetTicket() != 42 || c.GetWorker() != wA || !c.GetDelivered() || c.GetPromptTokens() != 100 || c.GetCachedTokens() != 64 {
		t.Fatalf("completion = %v in %v", c, first)
	}
}

func TestDryRunViaControlPlaneTakesNoLoad(t *testing.T) {
	cp := newFakeCP(t)
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot})
	d, err := r.Decide(context.Background(), &router.Request{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if !cp.lastRoute().GetDryRun() || d.Worker != wA {
		t.Fatalf("dry run: %+v, sent %v", d, cp.lastRoute())
	}
	for _, w := range r.Workers() {
		if w.Load != 0 {
			t.Fatalf("dry run took load on %s", w.URL)
		}
	}
}

func TestCompletionsAreBatched(t *testing.T) {
	cp := newFakeCP(t)
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, FlushInterval: 100 * time.Millisecond})
	run(t, r)
	const n = 20
	var ds []router.Decision
	for range n {
		d, err := r.Decide(context.Background(), &router.Request{Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	if l := loadOf(r, wA); l != n {
		t.Fatalf("local load = %d, want %d", l, n)
	}
	for i, d := range ds {
		r.Done(d, router.Outcome{Delivered: i%2 == 0, PromptTokens: i, CachedTokens: -1})
	}
	testkit.WaitFor(t, 5*time.Second, "all completions flushed", func() bool { _, all := cp.completions(); return len(all) == n })
	calls, all := cp.completions()
	if calls > 3 {
		t.Fatalf("%d completions took %d Complete calls", n, calls)
	}
	seen := map[uint64]bool{}
	for _, c := range all {
		tk := c.GetTicket()
		i := int(tk) - 1
		if seen[tk] || i < 0 || i >= n || c.GetDelivered() != (i%2 == 0) || c.GetPromptTokens() != int32(i) || c.GetCachedTokens() != -1 {
			t.Fatalf("completion %v (dup %v)", c, seen[tk])
		}
		seen[tk] = true
	}
}

// A full queue is flushed at once rather than at the next tick. (The
// requests all end after the last Route call: none rides with one.)
func TestCompletionsFlushWhenQueueFills(t *testing.T) {
	cp := newFakeCP(t)
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, FlushInterval: time.Hour})
	run(t, r)
	var ds []router.Decision
	for range 300 {
		d, err := r.Decide(context.Background(), &router.Request{})
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	for _, d := range ds {
		r.Done(d, router.Outcome{Delivered: true})
	}
	testkit.WaitFor(t, 5*time.Second, "early flush", func() bool { _, all := cp.completions(); return len(all) >= 256 })
}

// While the leader's answers say requests wait in its queue, each
// completion is reported at once: it frees room a waiting request needs,
// and a batched report would leave that room idle until the next tick.
// Without a queue the same completion waits for the tick (an hour here).
func TestCompletionsFlushAtOnceWhileTheLeaderQueues(t *testing.T) {
	cp := newFakeCP(t)
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, FlushInterval: time.Hour})
	run(t, r)
	decide := func() router.Decision {
		d, err := r.Decide(context.Background(), &router.Request{})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	calm := decide()
	r.Done(calm, router.Outcome{Delivered: true})
	cp.set(func(f *fakeCP) {
		f.routeFn = func(*cartv1.RouteRequest) *cartv1.RouteResponse {
			return &cartv1.RouteResponse{Worker: wA, Reason: "cache_miss", FromLeader: true, LeaderId: "n1", QueueDepth: 3}
		}
	})
	busy := decide()
	r.Done(busy, router.Outcome{Delivered: true})
	testkit.WaitFor(t, 5*time.Second, "the completions reported", func() bool { _, all := cp.completions(); return len(all) == 2 })
	calls, all := cp.completions()
	if calls != 1 || all[0].GetTicket() != calm.Ticket.ID || all[1].GetTicket() != busy.Ticket.ID {
		t.Fatalf("%d Complete calls carrying %v; want one call with both tickets (%d, %d), oldest first", calls, all, calm.Ticket.ID, busy.Ticket.ID)
	}
}

// riderRig is a data plane on the Route stream to a fake leader that
// says (or not) that it settles riders, with the flush left to the test.
func riderRig(t *testing.T, settles bool) (*streamCP, *Router) {
	t.Helper()
	cp, _ := newStreamCP(t)
	cp.batches, cp.settlesRiders = true, settles
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, RouteStream: true, FlushInterval: time.Hour, RouteTimeout: 5 * time.Second})
	run(t, r)
	streamLive(t, r, cp.url)
	return cp, r
}

// mustRoute routes a request the fake leader answers with worker wA.
func mustRoute(t *testing.T, r *Router) router.Decision {
	t.Helper()
	d, err := r.Decide(context.Background(), &router.Request{ID: wA})
	if err != nil || !d.FromLeader {
		t.Fatalf("route: %+v, %v", d, err)
	}
	return d
}

// carried is what the leader's last Route call carried.
func (f *fakeCP) carried() []*cartv1.Completion {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.routes[len(f.routes)-1].GetCompletions()
}

func tickets(cs []*cartv1.Completion) []uint64 {
	var out []uint64
	for _, c := range cs {
		out = append(out, c.GetTicket())
	}
	return out
}

// A flush tick sends only the completions that were already queued at the
// tick before: younger ones get an interval to ride with a Route call.
func TestFlushSendsAgedCompletions(t *testing.T) {
	cp, r := riderRig(t, true)
	first := mustRoute(t, r)
	r.Done(first, router.Outcome{Delivered: true})
	r.flush(context.Background(), flushTick)
	if calls, _ := cp.completions(); calls != 0 {
		t.Fatalf("a completion queued since the last tick was sent at once (%d Complete calls)", calls)
	}
	second := mustRoute(t, r) // carries first's
	if got := tickets(cp.carried()); !slices.Equal(got, []uint64{first.Ticket.ID}) {
		t.Fatalf("second call carried %v, want [%d]", got, first.Ticket.ID)
	}
	r.Done(second, router.Outcome{Delivered: true})
	r.flush(context.Background(), flushTick) // second's is young
	r.flush(context.Background(), flushTick) // now aged: sent
	calls, all := cp.completions()
	if calls != 1 || len(all) != 1 || all[0].GetTicket() != second.Ticket.ID {
		t.Fatalf("%d Complete calls with %v, want one with ticket %d", calls, all, second.Ticket.ID)
	}
	r.flush(context.Background(), flushTick)
	if calls, _ := cp.completions(); calls != 1 {
		t.Fatalf("%d Complete calls after an empty tick, want still 1", calls)
	}
}

// Completions queued when a Route call goes out ride with it, oldest
// first and at most maxRiders, instead of waiting for a Complete call;
// those of a call that failed, for whatever reason, go again with the
// next one.
func TestCompletionsRideWithRoutes(t *testing.T) {
	cp, r := riderRig(t, true)
	var ds []router.Decision
	for range maxRiders + 6 {
		ds = append(ds, mustRoute(t, r))
	}
	if got := cp.carried(); len(got) != 0 {
		t.Fatalf("nothing had ended, yet %v rode along", got)
	}
	for _, d := range ds {
		r.Done(d, router.Outcome{Delivered: true, PromptTokens: 10, CachedTokens: 5})
	}
	mustRoute(t, r)
	got := cp.carried()
	if len(got) != maxRiders || got[0].GetTicket() != ds[0].Ticket.ID || got[maxRiders-1].GetTicket() != ds[maxRiders-1].Ticket.ID ||
		got[0].GetWorker() != wA || !got[0].GetDelivered() || got[0].GetPromptTokens() != 10 || got[0].GetCachedTokens() != 5 {
		t.Fatalf("first call after the requests ended carried %v", got)
	}
	// Failed calls, one refused by the leader and one it could not take:
	// what each carried goes again with the next.
	mustRoute(t, r)
	if rest := tickets(cp.carried()); len(rest) != 6 || rest[0] != ds[maxRiders].Ticket.ID {
		t.Fatalf("the next call carried %v, want the 6 left", rest)
	}
	for _, code := range []connect.Code{connect.CodeResourceExhausted, connect.CodeUnavailable} {
		ended := []router.Decision{mustRoute(t, r), mustRoute(t, r)}
		for _, d := range ended {
			r.Done(d, router.Outcome{Delivered: true})
		}
		cp.set(func(f *fakeCP) { f.routeErr = connect.NewError(code, errors.New("no")) })
		_, _ = r.Decide(context.Background(), &router.Request{ID: wA})
		failed := tickets(cp.carried())
		cp.set(func(f *fakeCP) { f.routeErr = nil })
		streamLive(t, r, cp.url) // an Unavailable answer may end the stream
		mustRoute(t, r)
		want := []uint64{ended[0].Ticket.ID, ended[1].Ticket.ID}
		if again := tickets(cp.carried()); !slices.Equal(failed, want) || !slices.Equal(again, want) {
			t.Fatalf("%v: the failed call carried %v, the next one %v, want %v both", code, failed, again, want)
		}
	}
	if calls, _ := cp.completions(); calls != 0 {
		t.Fatalf("%d Complete calls: every completion should have ridden with a route", calls)
	}
}

// The report of an abandoned Route call never rides with a later call,
// which the leader could serve before the call it names: it waits for an
// aged flush.
func TestAbandonReportsDoNotRide(t *testing.T) {
	cp, r := riderRig(t, true)
	cp.set(func(f *fakeCP) { f.routeErr = connect.NewError(connect.CodeUnavailable, errors.New("down")) })
	if d, err := r.Decide(context.Background(), &router.Request{ID: wA}); err != nil || d.FromLeader {
		t.Fatalf("a failed call must fall back locally: %+v, %v", d, err)
	}
	abandonedID := func() uint64 { cp.mu.Lock(); defer cp.mu.Unlock(); return cp.routes[len(cp.routes)-1].GetRouteId() }()
	cp.set(func(f *fakeCP) { f.routeErr = nil })
	streamLive(t, r, cp.url)
	mustRoute(t, r)
	if got := cp.carried(); len(got) != 0 {
		t.Fatalf("the next call carried %v; an abandon report must not ride", got)
	}
	r.flush(context.Background(), flushTick)
	r.flush(context.Background(), flushTick)
	_, all := cp.completions()
	if len(all) != 1 || !all[0].GetAbandoned() || all[0].GetRouteId() != abandonedID {
		t.Fatalf("flushed %v, want the abandon report of route %d", all, abandonedID)
	}
}

// A leader whose hello answer does not say it settles riders (one that
// predates them would ignore them) gets every completion by Complete.
func TestNoRidersToAnOlderLeader(t *testing.T) {
	cp, r := riderRig(t, false)
	d := mustRoute(t, r)
	r.Done(d, router.Outcome{Delivered: true})
	mustRoute(t, r)
	if got := cp.carried(); len(got) != 0 {
		t.Fatalf("%v rode to a leader that does not settle riders", got)
	}
	r.flush(context.Background(), flushTick)
	r.flush(context.Background(), flushTick)
	if _, all := cp.completions(); len(all) != 1 || all[0].GetTicket() != d.Ticket.ID {
		t.Fatalf("flushed %v, want ticket %d", all, d.Ticket.ID)
	}
}

// A queue of flushAllAt completions is sent at once, but only the flush
// tick ages reports and sends abandon reports: one queued just before
// still waits a whole interval for the call it names to reach the leader.
func TestFullQueueLeavesAbandonReportsYoung(t *testing.T) {
	cp, r := riderRig(t, true)
	ended := mustRoute(t, r)
	r.abandon(77)
	for range flushAllAt - 1 {
		r.abandon(78)
	}
	r.Done(ended, router.Outcome{Delivered: true})
	r.flush(context.Background(), flushFull)
	r.flush(context.Background(), flushFull)
	calls, all := cp.completions()
	if calls != 1 || len(all) != 1 || all[0].GetTicket() != ended.Ticket.ID {
		t.Fatalf("full flushes sent %d calls with %v, want one with ticket %d only", calls, all, ended.Ticket.ID)
	}
	r.flush(context.Background(), flushTick) // ages them
	if calls, _ := cp.completions(); calls != 1 {
		t.Fatal("the first tick after full flushes sent abandon reports it had not aged")
	}
	// Aged now, but only a tick sends them: a full flush right after the
	// tick that aged them would send them a moment after they were queued.
	r.flush(context.Background(), flushFull)
	if calls, _ := cp.completions(); calls != 1 {
		t.Fatal("a full flush sent abandon reports")
	}
	r.flush(context.Background(), flushTick)
	if _, all := cp.completions(); len(all) != 1+flushAllAt || !all[1].GetAbandoned() || all[1].GetRouteId() != 77 {
		t.Fatalf("after two ticks %d reports were sent, want the completion and %d abandon reports", len(all), flushAllAt)
	}
}

// Only completions count towards flushAllAt: a burst of abandon reports
// must not make every Done ask for a flush of the few queued since.
func TestAbandonReportsDoNotFillTheQueue(t *testing.T) {
	r := newTestRouter(t, Options{ControlPlanes: []string{"http://127.0.0.1:1"}, BootWorkers: boot, FlushInterval: time.Hour})
	for range flushAllAt {
		r.abandon(9)
	}
	done := func(id uint64) {
		r.Done(router.Decision{Worker: wA, Ticket: router.Ticket{ID: id, Worker: wA}}, router.Outcome{Delivered: true})
	}
	done(1)
	if len(r.flushNow) != 0 {
		t.Fatal("abandon reports counted towards a full queue: Done asked for a flush")
	}
	for id := range uint64(flushAllAt - 1) {
		done(id + 2)
	}
	if len(r.flushNow) != 1 {
		t.Fatalf("%d completions queued and no flush asked for", flushAllAt)
	}
}

// A tick or kick that wins the select against the data plane's stop
// does not flush on the ended context, which would fail and drop what the
// last flush then sends.
func TestNoFlushOnAnEndedContext(t *testing.T) {
	cp := newFakeCP(t)
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, FlushInterval: time.Hour})
	r.Done(router.Decision{Worker: wA, Ticket: router.Ticket{ID: 3, Worker: wA}}, router.Outcome{Delivered: true})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r.flushUnlessDone(ctx, flushFull)
	if r.pending.len() != 1 {
		t.Fatal("a flush on an ended context took the queued completion")
	}
	r.flush(context.Background(), flushFinal)
	if _, all := cp.completions(); len(all) != 1 || all[0].GetTicket() != 3 {
		t.Fatalf("the last flush sent %v, want ticket 3", all)
	}
}

// Riders travel only on the stream they were taken for: if it ends before
// the call goes, the call fails (and puts them back) rather than going
// unary to a node that may not settle them.
func TestRidersNeverGoUnary(t *testing.T) {
	cp, r := riderRig(t, true)
	d := mustRoute(t, r)
	r.Done(d, router.Outcome{Delivered: true})
	st := r.streams.live(cp.url)
	_, riders := r.openCall(false, st)
	if len(riders) != 1 {
		t.Fatalf("took %d riders, want 1", len(riders))
	}
	before := cp.routeCount()
	close(cp.kill)
	testkit.WaitFor(t, 10*time.Second, "the stream to end", func() bool { return r.streams.live(cp.url) == nil })
	_, _, err := r.askLeader(context.Background(), nil, cp.url, st, &cartv1.RouteRequest{RequestId: wA, Completions: riders})
	if err == nil {
		t.Fatal("a call on an ended stream succeeded")
	}
	if n := cp.routeCount(); n != before {
		t.Fatalf("the call went elsewhere (%d Route calls reached the leader, want %d)", n, before)
	}
}

// The last flush, when the data plane stops, sends every queued report,
// young or not, abandon reports too.
func TestReportsFlushedOnStop(t *testing.T) {
	cp := newFakeCP(t)
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, FlushInterval: time.Hour})
	stop := run(t, r)
	d, err := r.Decide(context.Background(), &router.Request{})
	if err != nil {
		t.Fatal(err)
	}
	r.Done(d, router.Outcome{Delivered: false})
	r.abandon(5)
	stop()
	_, all := cp.completions()
	if len(all) != 2 || all[0].GetDelivered() || all[0].GetTicket() != d.Ticket.ID || !all[1].GetAbandoned() || all[1].GetRouteId() != 5 {
		t.Fatalf("reports after stop = %v", all)
	}
}

func TestFallbackOnTimeout(t *testing.T) {
	cp := newFakeCP(t)
	cp.set(func(f *fakeCP) { f.routeDelay = 5 * time.Second })
	var fb fallbacks
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, RouteTimeout: 20 * time.Millisecond, OnFallback: fb.on, FlushInterval: 10 * time.Millisecond})
	start := time.Now()
	d, err := r.Decide(context.Background(), &router.Request{Model: "m"})
	elapsed := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if d.Reason != ReasonFallbackLocal || d.FromLeader || (d.Worker != wA && d.Worker != wB) {
		t.Fatalf("decision = %+v", d)
	}
	if elapsed > time.Second {
		t.Fatalf("fallback took %v; the route timeout is 20ms", elapsed)
	}
	if got := fb.list(); !slices.Equal(got, []string{"timeout"}) {
		t.Fatalf("fallback causes = %v", got)
	}
	if l := loadOf(r, d.Worker); l != 1 {
		t.Fatalf("local load after fallback = %d", l)
	}
	run(t, r)
	r.Done(d, router.Outcome{Delivered: true})
	if l := loadOf(r, d.Worker); l != 0 {
		t.Fatalf("local load after Done = %d", l)
	}
	// The Route call it gave up on is reported abandoned, by the id it
	// was sent with, so the leader can undo whatever it decided; the
	// local decision itself is never reported.
	sent := cp.lastRoute().GetRouteId()
	if sent == 0 {
		t.Fatal("Route was sent without a route id")
	}
	testkit.WaitFor(t, 5*time.Second, "the abandoned call is reported", func() bool { _, all := cp.completions(); return len(all) > 0 })
	if _, all := cp.completions(); len(all) != 1 || !all[0].GetAbandoned() || all[0].GetRouteId() != sent || all[0].GetTicket() != 0 {
		t.Fatalf("completions = %v, want one abandoned report for route id %d", all, sent)
	}
}

func TestFallbackOnControlPlaneDown(t *testing.T) {
	var fb fallbacks
	r := newTestRouter(t, Options{ControlPlanes: []string{downURL(t)}, BootWorkers: boot, OnFallback: fb.on})
	d, err := r.Decide(context.Background(), &router.Request{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Reason != ReasonFallbackLocal {
		t.Fatalf("decision = %+v", d)
	}
	if got := fb.list(); len(got) != 1 || (got[0] != "unavailable" && got[0] != "error") {
		t.Fatalf("fallback causes = %v", got)
	}
}

func TestFallbackWithoutControlPlane(t *testing.T) {
	var fb fallbacks
	r := newTestRouter(t, Options{BootWorkers: boot, OnFallback: fb.on})
	if d, err := r.Decide(context.Background(), &router.Request{}); err != nil || d.Reason != ReasonFallbackLocal {
		t.Fatalf("Route = %+v, %v", d, err)
	}
	if got := fb.list(); !slices.Equal(got, []string{"no_control_plane"}) {
		t.Fatalf("fallback causes = %v", got)
	}
	if err := r.SyncOnce(context.Background()); err == nil {
		t.Fatal("SyncOnce without a control plane succeeded")
	}
}

func TestFallbackCauses(t *testing.T) {
	cases := []struct {
		code  connect.Code
		cause string
	}{
		{connect.CodeUnavailable, "unavailable"},
		{connect.CodeDeadlineExceeded, "timeout"},
		{connect.CodeUnauthenticated, "auth"},
		{connect.CodePermissionDenied, "auth"},
		{connect.CodeInternal, "error"},
		{connect.CodeFailedPrecondition, "error"},
	}
	for _, tc := range cases {
		t.Run(tc.code.String(), func(t *testing.T) {
			cp := newFakeCP(t)
			cp.set(func(f *fakeCP) { f.routeErr = connect.NewError(tc.code, errors.New("boom")) })
			var fb fallbacks
			r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, OnFallback: fb.on})
			d, err := r.Decide(context.Background(), &router.Request{})
			if err != nil || d.Reason != ReasonFallbackLocal {
				t.Fatalf("Route = %+v, %v", d, err)
			}
			if got := fb.list(); !slices.Equal(got, []string{tc.cause}) {
				t.Fatalf("causes = %v, want %s", got, tc.cause)
			}
		})
	}
}

// ResourceExhausted is the control plane's answer, not its failure: the
// pool is full or down, and routing around it locally would overload it.
func TestResourceExhaustedIsNotAFallback(t *testing.T) {
	cp := newFakeCP(t)
	cp.set(func(f *fakeCP) {
		f.routeErr = connect.NewError(connect.CodeResourceExhausted, errors.New("every usable worker is at max_load"))
	})
	var fb fallbacks
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, OnFallback: fb.on})
	_, err := r.Decide(context.Background(), &router.Request{})
	if !errors.Is(err, router.ErrUnavailable) {
		t.Fatalf("err = %v, want one wrapping router.ErrUnavailable", err)
	}
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("code = %v", connect.CodeOf(err))
	}
	if !strings.Contains(err.Error(), "max_load") {
		t.Fatalf("message = %q", err.Error())
	}
	if len(fb.list()) != 0 {
		t.Fatalf("fell back: %v", fb.list())
	}
	for _, w := range r.Workers() {
		if w.Load != 0 {
			t.Fatalf("load taken on %s", w.URL)
		}
	}
	// The node answered, so the router keeps talking to it.
	before := cp.routeCount()
	_, _ = r.Decide(context.Background(), &router.Request{})
	if cp.routeCount() != before+1 {
		t.Fatal("router moved away from a node that answered")
	}
}

func TestClientGoneIsNotAFallback(t *testing.T) {
	cp := newFakeCP(t)
	cp.set(func(f *fakeCP) { f.routeDelay = 5 * time.Second })
	var fb fallbacks
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, OnFallback: fb.on})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(30*time.Millisecond, cancel)
	_, err := r.Decide(ctx, &router.Request{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want the caller's context error", err)
	}
	if len(fb.list()) != 0 {
		t.Fatalf("fell back for a caller that left: %v", fb.list())
	}
	for _, w := range r.Workers() {
		if w.Load != 0 {
			t.Fatalf("load taken on %s", w.URL)
		}
	}
}

func TestNoWorkersKnown(t *testing.T) {
	r := newTestRouter(t, Options{ControlPlanes: []string{downURL(t)}})
	_, err := r.Decide(context.Background(), &router.Request{})
	if !errors.Is(err, router.ErrUnavailable) || !strings.Contains(err.Error(), "no workers configured") {
		t.Fatalf("err = %v", err)
	}
	r = newTestRouter(t, Options{BootWorkers: []router.WorkerStatus{{URL: wA}, {URL: wB}}})
	_, err = r.Decide(context.Background(), &router.Request{})
	if !errors.Is(err, router.ErrUnavailable) || !strings.Contains(err.Error(), "no usable worker") {
		t.Fatalf("all unhealthy: err = %v", err)
	}
}

func TestFallbackPicksLeastLoadedUsable(t *testing.T) {
	r := newTestRouter(t, Options{BootWorkers: []router.WorkerStatus{
		{URL: wA, Healthy: false},
		{URL: wB, Healthy: true},
		{URL: wC, Healthy: true, MaxLoad: 1},
		{URL: wD, Healthy: true, LoadPenalty: 5},
	}})
	pick := func(exclude ...string) (router.Decision, error) {
		return r.Decide(context.Background(), &router.Request{Exclude: exclude})
	}
	d1, err := pick(wB)
	if err != nil || d1.Worker != wC {
		t.Fatalf("first pick = %+v, %v; want %s (B excluded, A unhealthy, D penalised)", d1, err, wC)
	}
	d2, err := pick(wB)
	if err != nil || d2.Worker != wD {
		t.Fatalf("second pick = %+v, %v; want %s (C at max_load)", d2, err, wD)
	}
	d3, err := pick()
	if err != nil || d3.Worker != wB {
		t.Fatalf("third pick = %+v, %v; want %s", d3, err, wB)
	}
	// B has 1, D has 1+5: B again, until B reaches D's effective load.
	for i := 2; i <= 6; i++ {
		d, err := pick()
		if err != nil || d.Worker != wB {
			t.Fatalf("pick %d = %+v, %v; want %s", i, d, err, wB)
		}
	}
	if _, err := pick(wB, wD); !errors.Is(err, router.ErrUnavailable) {
		t.Fatalf("everything excluded or saturated: err = %v", err)
	}
	// Releasing C makes it usable again.
	r.Done(d1, router.Outcome{Delivered: true})
	if d, err := pick(wB, wD); err != nil || d.Worker != wC {
		t.Fatalf("after release = %+v, %v; want %s", d, err, wC)
	}
}

func TestFallbackTiesAreRandom(t *testing.T) {
	ws := []router.WorkerStatus{{URL: wA, Healthy: true}, {URL: wB, Healthy: true}, {URL: wC, Healthy: true}, {URL: wD, Healthy: true}}
	r := newTestRouter(t, Options{BootWorkers: ws, Seed: 7})
	const n = 8000
	count := map[string]int{}
	for range n {
		d, err := r.Decide(context.Background(), &router.Request{})
		if err != nil {
			t.Fatal(err)
		}
		count[d.Worker]++
		r.Done(d, router.Outcome{Delivered: true})
	}
	for _, w := range ws {
		// Expected 2000 each; sigma is about 39.
		if c := count[w.URL]; c < 1700 || c > 2300 {
			t.Fatalf("tie-break distribution %v is not uniform", count)
		}
	}
	// Dry runs too, and they take no load.
	clear(count)
	for range n {
		d, err := r.Decide(context.Background(), &router.Request{DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		count[d.Worker]++
	}
	for _, w := range ws {
		if c := count[w.URL]; c < 1700 || c > 2300 {
			t.Fatalf("dry-run tie-break distribution %v is not uniform", count)
		}
		if w := loadOf(r, w.URL); w != 0 {
			t.Fatalf("dry runs took load")
		}
	}
}

// Fallback decisions spread by local load: with equal load, successive
// decisions go to different workers.
func TestFallbackSpreadsByLocalLoad(t *testing.T) {
	ws := []router.WorkerStatus{{URL: wA, Healthy: true}, {URL: wB, Healthy: true}, {URL: wC, Healthy: true}}
	r := newTestRouter(t, Options{BootWorkers: ws})
	var ds []router.Decision
	for range 30 {
		d, err := r.Decide(context.Background(), &router.Request{})
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	for _, w := range r.Workers() {
		if w.Load != 10 {
			t.Fatalf("loads after 30 fallbacks = %+v, want 10 each", r.Workers())
		}
	}
	for _, d := range ds {
		r.Done(d, router.Outcome{Delivered: true})
	}
	for _, w := range r.Workers() {
		if w.Load != 0 {
			t.Fatalf("loads after Done = %+v", r.Workers())
		}
	}
}

func TestConcurrentRouteDone(t *testing.T) {
	cp := newFakeCP(t)
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, RouteTimeout: time.Second})
	run(t, r)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				if g%2 == 0 && i%10 == 0 {
					_ = r.SyncOnce(context.Background())
				}
				d, err := r.Decide(context.Background(), &router.Request{})
				if err != nil {
					t.Error(err)
					return
				}
				_ = r.Workers()
				r.Done(d, router.Outcome{Delivered: true})
			}
		}()
	}
	wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	for w, n := range r.local {
		if n != 0 {
			t.Fatalf("local load on %s = %d after every Done", w, n)
		}
	}
}

func TestLeaderDiscovery(t *testing.T) {
	follower, leader := newFakeCP(t), newFakeCP(t)
	follower.set(func(f *fakeCP) {
		f.syncResp = &cartv1.SyncResponse{Workers: []*cartv1.Worker{{Url: wA, Healthy: true}}, LeaderId: "n2", LeaderUrl: leader.url}
	})
	var fb fallbacks
	r := newTestRouter(t, Options{ControlPlanes: []string{downURL(t), follower.url, leader.url}, BootWorkers: boot, OnFallback: fb.on})
	r.target = 0 // start at the dead node

	d, err := r.Decide(context.Background(), &router.Request{})
	if err != nil || d.Reason != ReasonFallbackLocal {
		t.Fatalf("route via the dead node = %+v, %v", d, err)
	}
	r.Done(d, router.Outcome{Delivered: true})
	d, err = r.Decide(context.Background(), &router.Request{})
	if err != nil || !d.FromLeader || follower.routeCount() != 1 {
		t.Fatalf("route after rotating = %+v, %v (follower saw %d)", d, err, follower.routeCount())
	}
	r.Done(d, router.Outcome{Delivered: true})

	if err := r.SyncOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		d, err := r.Decide(context.Background(), &router.Request{})
		if err != nil || !d.FromLeader {
			t.Fatalf("route after sync = %+v, %v", d, err)
		}
		r.Done(d, router.Outcome{Delivered: true})
	}
	if follower.routeCount() != 1 || leader.routeCount() != 3 {
		t.Fatalf("after learning the leader: follower saw %d routes, leader %d; want 1, 3", follower.routeCount(), leader.routeCount())
	}

	// The leader dies: the router forgets it and goes back to the list.
	leader.srv.Close()
	d, err = r.Decide(context.Background(), &router.Request{})
	if err != nil || d.Reason != ReasonFallbackLocal {
		t.Fatalf("route via the dead leader = %+v, %v", d, err)
	}
	r.Done(d, router.Outcome{Delivered: true})
	if d, err := r.Decide(context.Background(), &router.Request{}); err != nil || !d.FromLeader || follower.routeCount() != 2 {
		t.Fatalf("route after the leader died = %+v, %v (follower saw %d)", d, err, follower.routeCount())
	}
}

func TestSyncRotatesOnFailure(t *testing.T) {
	cp := newFakeCP(t)
	r := newTestRouter(t, Options{ControlPlanes: []string{downURL(t), cp.url}})
	r.target = 0
	if err := r.SyncOnce(context.Background()); err == nil {
		t.Fatal("sync with a dead node succeeded")
	}
	if r.Synced() {
		t.Fatal("Synced after a failed sync")
	}
	if err := r.SyncOnce(context.Background()); err != nil {
		t.Fatalf("sync after rotating: %v", err)
	}
	if !r.Synced() {
		t.Fatal("not Synced after a successful sync")
	}
}

func TestSyncReportsLoadsAndReplacesWorkers(t *testing.T) {
	cp := newFakeCP(t)
	var fb fallbacks
	r := newTestRouter(t, Options{ID: "dp7", ControlPlanes: []string{cp.url}, BootWorkers: []router.WorkerStatus{{URL: wB, Healthy: true}}, RouteTimeout: 500 * time.Millisecond, OnFallback: fb.on})
	// Two decisions by the control plane (on wA), one local fallback (on
	// wB, the only worker this data plane knows before its first sync).
	var ds []router.Decision
	for range 2 {
		d, err := r.Decide(context.Background(), &router.Request{})
		if err != nil || d.Worker != wA {
			t.Fatalf("Route = %+v, %v", d, err)
		}
		ds = append(ds, d)
	}
	cp.set(func(f *fakeCP) { f.routeDelay = 5 * time.Second })
	fbd, err := r.Decide(context.Background(), &router.Request{})
	if err != nil || fbd.Reason != ReasonFallbackLocal || fbd.Worker != wB {
		t.Fatalf("fallback = %+v, %v", fbd, err)
	}
	cp.set(func(f *fakeCP) {
		f.routeDelay = 0
		f.syncResp = &cartv1.SyncResponse{
			Workers: []*cartv1.Worker{
				{Url: wA, Healthy: true, MaxLoad: 3, LoadPenalty: 1, Load: 17},
				{Url: wC, Healthy: false},
			},
			WorkersVersion: 5, BlockChars: 64, LeaderId: "n1", LeaderUrl: cp.url,
		}
	})
	if err := r.SyncOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	req := cp.syncRequests()[0]
	loads := map[string]uint32{}
	for _, l := range req.GetLoads() {
		loads[l.GetWorker()] = l.GetInFlight()
	}
	if req.GetDataplaneId() != "dp7" || req.GetFallbacks() != 1 || len(loads) != 2 || loads[wA] != 2 || loads[wB] != 1 {
		t.Fatalf("SyncRequest = %v", req)
	}
	want := []router.WorkerStatus{
		{URL: wA, Healthy: true, MaxLoad: 3, LoadPenalty: 1, Load: 2}, // our own count, not the leader's
		{URL: wC, Healthy: false},
	}
	if got := r.Workers(); !slices.Equal(got, want) {
		t.Fatalf("Workers after sync = %+v, want %+v", got, want)
	}
	r.mu.Lock()
	version := r.version
	r.mu.Unlock()
	if version != 5 {
		t.Fatalf("workers version = %d", version)
	}
	// The fallback count was reported once.
	if err := r.SyncOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if req := cp.syncRequests()[1]; req.GetFallbacks() != 0 {
		t.Fatalf("second SyncRequest reports %d fallbacks again", req.GetFallbacks())
	}
	// The in-flight request on wB (no longer in the set) still counts
	// until it is done.
	r.Done(fbd, router.Outcome{Delivered: true})
	if err := r.SyncOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, l := range cp.syncRequests()[2].GetLoads() {
		if l.GetWorker() == wB {
			t.Fatalf("finished request still reported: %v", cp.syncRequests()[2])
		}
	}
	// Fallback now follows the new set: wC is unhealthy, wA has room for
	// one more (2 of max 3), then nothing.
	cp.set(func(f *fakeCP) { f.routeErr = connect.NewError(connect.CodeUnavailable, errors.New("down")) })
	d, err := r.Decide(context.Background(), &router.Request{})
	if err != nil || d.Worker != wA || d.Reason != ReasonFallbackLocal {
		t.Fatalf("fallback after sync = %+v, %v", d, err)
	}
	if _, err := r.Decide(context.Background(), &router.Request{}); !errors.Is(err, router.ErrUnavailable) {
		t.Fatalf("fallback with wA saturated and wC unhealthy: %v", err)
	}
	for _, d := range ds {
		r.Done(d, router.Outcome{Delivered: true})
	}
}

func TestSyncFailureKeepsFallbackCount(t *testing.T) {
	cp := newFakeCP(t)
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot})
	cp.set(func(f *fakeCP) { f.routeErr = connect.NewError(connect.CodeUnavailable, errors.New("down")) })
	for range 2 {
		d, err := r.Decide(context.Background(), &router.Request{})
		if err != nil || d.Reason != ReasonFallbackLocal {
			t.Fatalf("Route = %+v, %v", d, err)
		}
	}
	cp.set(func(f *fakeCP) { f.syncErr = connect.NewError(connect.CodeUnavailable, errors.New("down")) })
	if err := r.SyncOnce(context.Background()); err == nil {
		t.Fatal("sync succeeded")
	}
	if r.Synced() || len(r.Workers()) != 2 {
		t.Fatalf("a failed sync changed the worker set: %+v", r.Workers())
	}
	d, err := r.Decide(context.Background(), &router.Request{})
	if err != nil || d.Reason != ReasonFallbackLocal {
		t.Fatalf("Route = %+v, %v", d, err)
	}
	cp.set(func(f *fakeCP) { f.syncErr = nil })
	if err := r.SyncOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	reqs := cp.syncRequests()
	last := reqs[len(reqs)-1]
	var inFlight uint32
	for _, l := range last.GetLoads() {
		inFlight += l.GetInFlight()
	}
	if last.GetFallbacks() != 3 || inFlight != 3 {
		t.Fatalf("SyncRequest after a failed one = %v; want 3 fallbacks, 3 in flight", last)
	}
}

func TestBootWorkersUntilFirstSync(t *testing.T) {
	cp := newFakeCP(t)
	bootSet := []router.WorkerStatus{{URL: wB, Healthy: true}, {URL: wC, Healthy: true}}
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: bootSet})
	if r.Synced() {
		t.Fatal("Synced before any sync")
	}
	if got := r.Workers(); !slices.Equal(got, bootSet) {
		t.Fatalf("Workers before sync = %+v", got)
	}
	// The caller's slice is not aliased.
	bootSet[0].Healthy = false
	if !r.Workers()[0].Healthy {
		t.Fatal("router aliases the boot worker slice")
	}
	cp.set(func(f *fakeCP) { f.routeErr = connect.NewError(connect.CodeUnavailable, errors.New("down")) })
	seen := map[string]bool{}
	for range 20 {
		d, err := r.Decide(context.Background(), &router.Request{DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		seen[d.Worker] = true
	}
	if len(seen) != 2 || !seen[wB] || !seen[wC] {
		t.Fatalf("fallback before sync used %v, want the boot workers", seen)
	}

	stop := run(t, r) // Run syncs at once
	testkit.WaitFor(t, 5*time.Second, "first sync", r.Synced)
	stop()
	if got := r.Workers(); len(got) != 1 || got[0].URL != wA {
		t.Fatalf("Workers after sync = %+v, want the control plane's set", got)
	}
	for range 10 {
		d, err := r.Decide(context.Background(), &router.Request{DryRun: true})
		if err != nil || d.Worker != wA {
			t.Fatalf("fallback after sync = %+v, %v", d, err)
		}
	}
}

func TestRunSyncsPeriodically(t *testing.T) {
	cp := newFakeCP(t)
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, SyncInterval: 20 * time.Millisecond})
	run(t, r)
	testkit.WaitFor(t, 5*time.Second, "several syncs", func() bool { return len(cp.syncRequests()) >= 3 })
}

// A worker the control plane reports healthy again is announced once, so
// the data plane can stop showing (and enforcing) a stale open breaker.
func TestOnHealthyAfterRecovery(t *testing.T) {
	cp := newFakeCP(t)
	var mu sync.Mutex
	var got []string
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, OnHealthy: func(u string) {
		mu.Lock()
		got = append(got, u)
		mu.Unlock()
	}})
	syncWith := func(aHealthy bool) {
		t.Helper()
		cp.set(func(f *fakeCP) {
			f.syncResp = &cartv1.SyncResponse{Workers: []*cartv1.Worker{{Url: wA, Healthy: aHealthy}, {Url: wB, Healthy: true}}}
		})
		if err := r.SyncOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	syncWith(true)
	syncWith(false)
	syncWith(true)
	syncWith(true)
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(got, []string{wA}) {
		t.Fatalf("OnHealthy calls %v, want exactly one for %s", got, wA)
	}
}

// TestRejectedClusterTokenWarns: a data plane whose token the control plane
// rejects keeps serving by local fallback, so the misconfiguration must be
// visible at WARN (once per period, not once per request), while ordinary
// transient failures stay at DEBUG.
func TestRejectedClusterTokenWarns(t *testing.T) {
	cp := newFakeCP(t)
	cp.set(func(f *fakeCP) {
		f.routeErr = connect.NewError(connect.CodeUnauthenticated, errors.New("missing or invalid bearer token"))
		f.syncErr = f.routeErr
	})
	rec := testkit.NewLogRecorder()
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, Token: "wrong", Logger: slog.New(rec),
		BootWorkers: []router.WorkerStatus{{URL: wA, Healthy: true}}})
	for i := 0; i < 5; i++ {
		d, err := r.Decide(context.Background(), &router.Request{ID: "r"})
		if err != nil || d.Reason != "fallback_local" {
			t.Fatalf("Route = %+v, %v; want a local fallback", d, err)
		}
		r.Done(d, router.Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1})
	}
	_ = r.SyncOnce(context.Background())
	if n := rec.Count(slog.LevelWarn, "rejected this data plane's cluster token"); n != 1 {
		t.Fatalf("%d rejected-token warnings for 5 routes and a sync, want exactly 1", n)
	}

	cp.set(func(f *fakeCP) {
		f.routeErr = connect.NewError(connect.CodeUnavailable, errors.New("no leader"))
	})
	if _, err := r.Decide(context.Background(), &router.Request{ID: "r2"}); err != nil {
		t.Fatal(err)
	}
	if n := rec.Count(slog.LevelDebug, "route via control plane failed"); n != 1 {
		t.Fatalf("an Unavailable answer should be logged at debug once, got %d", n)
	}
}

// A worker the leader reports draining (it left DNS) gets no new requests
// from local fallback either, even when it is the least loaded.
func TestFallbackSkipsDrainingWorkers(t *testing.T) {
	r := newTestRouter(t, Options{BootWorkers: []router.WorkerStatus{
		{URL: wA, Healthy: true, Draining: true},
		{URL: wB, Healthy: true, LoadPenalty: 5},
	}})
	for i := range 5 {
		d, err := r.Decide(context.Background(), &router.Request{})
		if err != nil || d.Worker != wB {
			t.Fatalf("pick %d = %+v, %v; want %s (A draining)", i, d, err, wB)
		}
	}
}

// The engine cache the leader reports for a worker reaches the data plane's
// worker list (and so its /workers).
func TestSyncCarriesTheEngineCache(t *testing.T) {
	cp := newFakeCP(t)
	cp.set(func(f *fakeCP) {
		f.syncResp = &cartv1.SyncResponse{Workers: []*cartv1.Worker{
			{Url: wA, Healthy: true, KvCache: &cartv1.KVCache{OccupiedTokens: 7, CapacityTokens: 9}},
			{Url: wB, Healthy: true},
		}}
	})
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}})
	if err := r.SyncOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, w := range r.Workers() {
		switch {
		case w.URL == wA && (w.KVEvents == nil || w.KVEvents.OccupiedTokens != 7 || w.KVEvents.CapacityTokens != 9):
			t.Fatalf("A: %+v", w.KVEvents)
		case w.URL == wB && w.KVEvents != nil:
			t.Fatalf("B without events: %+v", w.KVEvents)
		}
	}
}

// A control plane with another cache.block_chars gets Route calls without
// block hashes (ours would never match its index and would fill it): it
// still balances and pins. Agreement, or a control plane that does not
// say, brings the hashes back.
func TestBlockCharsMismatchRoutesWithoutHashes(t *testing.T) {
	cp := newFakeCP(t)
	var fb fallbacks
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BlockChars: 64, OnFallback: fb.on})
	workers := []*cartv1.Worker{{Url: wA, Healthy: true}}
	lastRoute := func() *cartv1.RouteRequest {
		cp.mu.Lock()
		defer cp.mu.Unlock()
		return cp.routes[len(cp.routes)-1]
	}
	for _, c := range []struct {
		bc     uint32
		hashes int
	}{{128, 0}, {64, 2}, {128, 0}, {0, 2}} {
		cp.set(func(f *fakeCP) {
			f.syncResp = &cartv1.SyncResponse{Workers: workers, WorkersVersion: 1, BlockChars: c.bc}
		})
		if err := r.SyncOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		d, err := r.Decide(context.Background(), &router.Request{Hashes: []uint64{1, 2}, KeyLen: 100, Session: "s1"})
		if err != nil || d.Reason == ReasonFallbackLocal {
			t.Fatalf("block_chars %d: Route = %+v, %v; want the control plane's decision", c.bc, d, err)
		}
		if m := lastRoute(); len(m.GetBlockHashes()) != c.hashes || m.GetKeyLength() != 100 || m.GetSessionKey() != "s1" {
			t.Fatalf("block_chars %d: Route call %v; want %d hashes, key length and session kept", c.bc, m, c.hashes)
		}
	}
	if got := fb.list(); len(got) != 0 {
		t.Errorf("fallbacks %v, want none", got)
	}
}

// A control-plane node's answer is read only up to Options.MaxAnswerBytes
// (cpclient.MaxAnswerBytes by default): a larger one is refused, not
// buffered, and the data plane keeps what it had.
func TestSyncAnswerOverTheReadLimitIsRefused(t *testing.T) {
	if d := New(Options{}); d.o.MaxAnswerBytes != cpclient.MaxAnswerBytes {
		t.Fatalf("default answer limit %d, want %d", d.o.MaxAnswerBytes, cpclient.MaxAnswerBytes)
	}
	const limit = 1 << 20
	cp := newFakeCP(t)
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, MaxAnswerBytes: limit})
	if err := r.SyncOnce(context.Background()); err != nil {
		t.Fatalf("first sync: %v", err)
	}
	big := strings.Repeat("w", 64<<10)
	var workers []*cartv1.Worker
	for i := 0; i*len(big) <= limit; i++ {
		workers = append(workers, &cartv1.Worker{Url: fmt.Sprintf("http://%d.%s", i, big), Healthy: true})
	}
	cp.set(func(f *fakeCP) { f.syncResp = &cartv1.SyncResponse{Workers: workers, WorkersVersion: 99} })
	err := r.SyncOnce(context.Background())
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("sync of a %d-worker answer over the limit: %v, want resource_exhausted", len(workers), err)
	}
	if slices.ContainsFunc(r.Workers(), func(w router.WorkerStatus) bool { return w.URL == workers[0].Url }) {
		t.Error("a worker of the refused answer is known")
	}
	// Just under the limit still goes through.
	n := limit/(len(big)+64) - 1
	cp.set(func(f *fakeCP) { f.syncResp = &cartv1.SyncResponse{Workers: workers[:n], WorkersVersion: 100} })
	if err := r.SyncOnce(context.Background()); err != nil {
		t.Fatalf("sync of a %d-worker answer under the limit: %v", n, err)
	}
}

// A Sync's fence lists, under the same lock as its counts, what they
// cannot include yet: calls without an answer, abandon reports and
// completions the leader has not acknowledged (queued or riding), and how
// many ticketed requests have finished.
func TestSyncFenceListsWhatTheCountsMiss(t *testing.T) {
	r := newTestRouter(t, Options{ControlPlanes: []string{"http://127.0.0.1:1"}, BootWorkers: boot, FlushInterval: time.Hour})
	fence := func() *cartv1.SyncRequest {
		req := r.syncRequest()
		slices.Sort(req.OpenRouteIds)
		slices.Sort(req.UnsettledTickets)
		return req
	}
	open, _ := r.openCall(true, nil) // no answer yet
	answered, _ := r.openCall(true, nil)
	r.closeCall(answered, nil, false, false, wA, "") // answered: in the counts
	given, _ := r.openCall(true, nil)
	r.closeCall(given, nil, true, true, "", "") // given up on: abandon report queued
	dry, _ := r.openCall(false, nil)            // a dry run is not named
	for _, id := range []uint64{7, 8} {
		r.Done(router.Decision{Worker: wA, Ticket: router.Ticket{ID: id, Worker: wA}}, router.Outcome{Delivered: true})
	}
	riding, riders := r.openCall(true, &routeStream{riders: true})
	if dry != 0 || len(riders) != 2 {
		t.Fatalf("dry run named %d; %d riders, want 2", dry, len(riders))
	}
	f := fence()
	if f.GetLastRouteId() != riding || !slices.Equal(f.GetOpenRouteIds(), []uint64{open, given, riding}) ||
		!slices.Equal(f.GetUnsettledTickets(), []uint64{7, 8}) || f.GetDoneSeq() != 2 {
		t.Fatalf("fence = last %d open %v unsettled %v done %d; want %d, %v, [7 8], 2",
			f.GetLastRouteId(), f.GetOpenRouteIds(), f.GetUnsettledTickets(), f.GetDoneSeq(), riding, []uint64{open, given, riding})
	}
	// The riding call fails: its riders are queued again (still
	// unsettled), its abandon report is queued (still open).
	r.closeCall(riding, riders, true, true, "", "")
	if f := fence(); !slices.Equal(f.GetOpenRouteIds(), []uint64{open, given, riding}) || !slices.Equal(f.GetUnsettledTickets(), []uint64{7, 8}) {
		t.Fatalf("after the failed call: open %v unsettled %v", f.GetOpenRouteIds(), f.GetUnsettledTickets())
	}
	// A call that rides and is answered: its riders are settled.
	ok, riders := r.openCall(true, &routeStream{riders: true})
	r.closeCall(ok, riders, false, false, wA, "")
	if f := fence(); !slices.Equal(f.GetOpenRouteIds(), []uint64{open, given, riding}) || len(f.GetUnsettledTickets()) != 0 {
		t.Fatalf("after the answered call: open %v unsettled %v", f.GetOpenRouteIds(), f.GetUnsettledTickets())
	}
}

// Reports a flush has taken and the leader has not acknowledged stay in
// the fence until the call returns.
func TestSyncFenceListsReportsInAFlush(t *testing.T) {
	cp, _ := newStreamCP(t)
	cp.batches = true
	in, release := make(chan struct{}), make(chan struct{})
	cp.hold = func(m *cartv1.StreamRequest) {
		if m.GetComplete() != nil {
			in <- struct{}{}
			<-release
		}
	}
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, RouteStream: true, FlushInterval: time.Hour, RouteTimeout: 5 * time.Second})
	run(t, r)
	streamLive(t, r, cp.url)
	d := mustRoute(t, r)
	r.Done(d, router.Outcome{Delivered: true})
	r.abandon(42)
	r.flush(context.Background(), flushTick) // ages them
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.flush(context.Background(), flushTick)
	}()
	<-in
	req := r.syncRequest()
	if !slices.Equal(req.GetUnsettledTickets(), []uint64{d.Ticket.ID}) || !slices.Equal(req.GetOpenRouteIds(), []uint64{42}) {
		t.Fatalf("fence during the flush: unsettled %v open %v, want [%d] [42]", req.GetUnsettledTickets(), req.GetOpenRouteIds(), d.Ticket.ID)
	}
	close(release)
	<-done
	req = r.syncRequest()
	if len(req.GetUnsettledTickets())+len(req.GetOpenRouteIds()) != 0 {
		t.Fatalf("fence after the flush: unsettled %v open %v, want none", req.GetUnsettledTickets(), req.GetOpenRouteIds())
	}
}

// A flush whose Complete call fails (it may still have reached the
// leader) queues its reports again: they stay in the Syncs' fence and go
// with the next tick, and while flushes fail no full queue forces one.
func TestFailedFlushRequeuesItsReports(t *testing.T) {
	cp := newFakeCP(t)
	cp.set(func(f *fakeCP) { f.completeErr = connect.NewError(connect.CodeDeadlineExceeded, errors.New("slow")) })
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, FlushInterval: time.Hour})
	done := func(id uint64) {
		r.Done(router.Decision{Worker: wA, Ticket: router.Ticket{ID: id, Worker: wA}}, router.Outcome{Delivered: true})
	}
	done(1)
	r.abandon(40)
	r.flush(context.Background(), flushTick)
	r.flush(context.Background(), flushTick) // sent, failed
	fence := r.syncRequest
	if f := fence(); !slices.Equal(f.GetUnsettledTickets(), []uint64{1}) || !slices.Equal(f.GetOpenRouteIds(), []uint64{40}) {
		t.Fatalf("after a failed flush the fence lists %v and %v, want [1] and [40]", f.GetUnsettledTickets(), f.GetOpenRouteIds())
	}
	for id := range uint64(flushAllAt) {
		done(id + 2)
	}
	if len(r.flushNow) != 0 {
		t.Fatal("a full queue asked for a flush while flushes fail")
	}
	cp.set(func(f *fakeCP) { f.completeErr = nil })
	r.flush(context.Background(), flushTick) // a full queue, the requeued ones first
	calls, _ := cp.completions()
	cp.mu.Lock()
	last := cp.completes[len(cp.completes)-1].GetCompletions()
	cp.mu.Unlock()
	if n := len(last); calls != 2 || n != flushAllAt+2 || last[0].GetTicket() != 1 || !last[n-1].GetAbandoned() || last[n-1].GetRouteId() != 40 {
		t.Fatalf("%d Complete calls, the last with %d reports; want 2, the last with the requeued two and the %d since", calls, len(last), flushAllAt)
	}
	if f := fence(); slices.Contains(f.GetUnsettledTickets(), 1) || len(f.GetOpenRouteIds()) != 0 {
		t.Fatalf("after the flush worked the fence still lists %v and %v", f.GetUnsettledTickets(), f.GetOpenRouteIds())
	}
	for id := range uint64(flushAllAt) {
		done(id + 1000)
	}
	if len(r.flushNow) != 1 {
		t.Fatal("once a flush works, a full queue asks for one again")
	}
}

// Each Sync names this process and numbers itself, so that the leader
// ignores a late or repeated one.
func TestSyncsAreNumbered(t *testing.T) {
	cp := newFakeCP(t)
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, FlushInterval: time.Hour})
	for range 2 {
		if err := r.SyncOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	s := cp.syncRequests()
	if len(s) != 2 || s[0].GetFirstRouteId() == 0 || s[1].GetFirstRouteId() != s[0].GetFirstRouteId() ||
		s[0].GetSyncSeq() != 1 || s[1].GetSyncSeq() != 2 || s[0].GetLastRouteId() != s[0].GetFirstRouteId()-1 {
		t.Fatalf("syncs: %v", s)
	}
}
