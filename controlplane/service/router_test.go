package service

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/cartrouter/cart/controlplane/cpclient"
	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
)

const (
	w1 = "http://w1.test:8000"
	w2 = "http://w2.test:8000"
	w3 = "http://w3.test:8000"
)

// protocols are the wire protocols one handler serves; every client
// behaviour below must hold for all of them.
var protocols = []struct {
	name string
	opts []connect.ClientOption
}{
	{"connect", []connect.ClientOption{connect.WithClientOptions()}},
	{"connect+json", []connect.ClientOption{connect.WithProtoJSON()}},
	{"grpc", []connect.ClientOption{connect.WithGRPC()}},
	{"grpcweb", []connect.ClientOption{connect.WithGRPCWeb()}},
}

func TestRouteProtocols(t *testing.T) {
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			cp := newTestCP(t, cpConfig{leader: true})
			rc := cp.router(p.opts...)
			ctx := context.Background()

			_, err := rc.Route(ctx, connect.NewRequest(&cartv1.RouteRequest{Text: "hello"}))
			ce := wantCode(t, err, connect.CodeResourceExhausted)
			if !strings.Contains(ce.Message(), "no workers configured") || cpclient.HasDetail[*cartv1.PoolSaturated](ce, connect.CodeResourceExhausted) {
				t.Fatalf("no-workers message = %q", ce.Message())
			}

			cp.addWorkers(t, w1, w2, w3)

			// By text: the control plane hashes.
			txt := text(100, 1)
			first := liveRoute(t, rc, txt)
			if first.GetReason() != "cache_miss" || first.GetTicket() == 0 || !first.GetFromLeader() || first.GetLeaderId() != "n1" || first.GetWorker() == "" {
				t.Fatalf("first route = %v", first)
			}
			second := liveRoute(t, rc, txt)
			if second.GetReason() != "cache_hit" || second.GetWorker() != first.GetWorker() {
				t.Fatalf("second route = %v, want cache_hit on %s", second, first.GetWorker())
			}
			if second.GetMatchedChars() != 100 || second.GetMatchedRatio() != 1 || second.GetChosenChars() != 100 || second.GetCandidate() != first.GetWorker() {
				t.Fatalf("second route match fields = %v", second)
			}
			if second.GetTicket() == first.GetTicket() {
				t.Fatalf("tickets repeat: %d", second.GetTicket())
			}

			// By block hashes, as data planes send them; the text route
			// afterwards must agree with the hashes (same wire format).
			txt2 := text(80, 2)
			byHash := route(t, rc, &cartv1.RouteRequest{Model: "m", BlockHashes: hashes("m", txt2), KeyLength: 80, DataplaneId: "dp1"})
			if byHash.GetReason() != "cache_miss" || byHash.GetTicket() == 0 {
				t.Fatalf("hash route = %v", byHash)
			}
			again := route(t, rc, &cartv1.RouteRequest{Model: "m", BlockHashes: hashes("m", txt2), KeyLength: 80, DataplaneId: "dp1"})
			if again.GetReason() != "cache_hit" || again.GetWorker() != byHash.GetWorker() || again.GetMatchedChars() != 80 {
				t.Fatalf("second hash route = %v, want cache_hit on %s", again, byHash.GetWorker())
			}
			viaText := liveRoute(t, rc, txt2)
			if viaText.GetReason() != "cache_hit" || viaText.GetWorker() != byHash.GetWorker() {
				t.Fatalf("text route after hash route = %v, want cache_hit on %s", viaText, byHash.GetWorker())
			}
			// Another model never shares the prefix.
			other := route(t, rc, &cartv1.RouteRequest{Model: "other", Text: txt2, DryRun: true})
			if other.GetReason() != "cache_miss" {
				t.Fatalf("other model route = %v, want cache_miss", other)
			}

			// A prompt longer than the engine looks is routed on its
			// prefix, not refused.
			long := hashes("m", text(testBlockChars*(engine.MaxRouteBlocks+500), 9))
			lr := route(t, rc, &cartv1.RouteRequest{Model: "m", BlockHashes: long, DataplaneId: "dp1"})
			if lr.GetTicket() == 0 {
				t.Fatalf("long route = %v", lr)
			}
			prefix := route(t, rc, &cartv1.RouteRequest{Model: "m", BlockHashes: long[:engine.MaxRouteBlocks+7], DataplaneId: "dp1", DryRun: true})
			if prefix.GetReason() != "cache_hit" || prefix.GetWorker() != lr.GetWorker() || prefix.GetMatchedChars() != uint32(testBlockChars*engine.MaxRouteBlocks) {
				t.Fatalf("route sharing the long prompt's prefix = %v, want a hit on %s over %d chars", prefix, lr.GetWorker(), testBlockChars*engine.MaxRouteBlocks)
			}
		})
	}
}

func TestRouteEmptyText(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true})
	cp.addWorkers(t, w1)
	r := route(t, cp.router(), &cartv1.RouteRequest{DataplaneId: "dp1"})
	if r.GetReason() != "empty_text" || r.GetWorker() != w1 || r.GetTicket() == 0 {
		t.Fatalf("empty route = %v", r)
	}
	if got := cp.loads(t)[w1]; got != 1 {
		t.Fatalf("load after empty-text route = %d, want 1", got)
	}
}

func TestRouteDryRun(t *testing.T) {
	cp, rc := leaderWith(t, w1, w2)
	txt := text(64, 3)
	for range 3 {
		d := route(t, rc, &cartv1.RouteRequest{Model: "m", Text: txt, DataplaneId: "dp1", DryRun: true})
		if d.GetTicket() != 0 || d.GetReason() != "cache_miss" || d.GetWorker() == "" {
			t.Fatalf("dry run = %v; want cache_miss, no ticket", d)
		}
	}
	for w, l := range cp.loads(t) {
		if l != 0 {
			t.Fatalf("dry run took load on %s: %d", w, l)
		}
	}
	st, err := cp.admin().ClusterStatus(context.Background(), connect.NewRequest(&cartv1.ClusterStatusRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if st.Msg.GetIndexEntries() != 0 || st.Msg.GetDataplanes() != 0 {
		t.Fatalf("dry run left state: index entries %d, data planes %d", st.Msg.GetIndexEntries(), st.Msg.GetDataplanes())
	}
	// A real route after the dry runs is a barrier: windows are proposed in
	// order, so once its placement is replicated, anything the dry runs had
	// queued would be too. Only the marker's placement may be there.
	liveRoute(t, rc, text(64, 99))
	testkit.WaitFor(t, 5*time.Second, "the marker's placement replicated", func() bool { return len(cp.node.placeBatches()) > 0 })
	if len(placementsOf(cp.node.placeBatches())) != 1 {
		t.Fatalf("dry run replicated placements: %v", cp.node.placeBatches())
	}
	// A dry run settles nothing either: ticket 0 is not a ticket.
	if n := complete(t, rc, "dp1", &cartv1.Completion{Ticket: 0, Worker: w1, Delivered: true}); n != 0 {
		t.Fatalf("Complete(ticket 0) settled %d", n)
	}
}

func TestRouteExclude(t *testing.T) {
	_, rc := leaderWith(t, w1, w2, w3)
	txt := text(96, 4)
	first := liveRoute(t, rc, txt)
	for range 10 {
		d := route(t, rc, &cartv1.RouteRequest{Model: "m", Text: txt, DataplaneId: "dp1", ExcludeWorkers: []string{first.GetWorker()}, DryRun: true})
		if d.GetWorker() == first.GetWorker() {
			t.Fatalf("excluded worker %s chosen: %v", first.GetWorker(), d)
		}
		if d.GetReason() == "cache_hit" {
			t.Fatalf("cache_hit on a worker that holds nothing: %v", d)
		}
	}
	all := []string{w1, w2, w3}
	for _, keep := range all {
		ex := slices.DeleteFunc(slices.Clone(all), func(s string) bool { return s == keep })
		d := route(t, rc, &cartv1.RouteRequest{Model: "m", Text: txt, ExcludeWorkers: ex, DryRun: true})
		if d.GetWorker() != keep {
			t.Fatalf("exclude %v chose %s, want %s", ex, d.GetWorker(), keep)
		}
	}
	_, err := rc.Route(context.Background(), connect.NewRequest(&cartv1.RouteRequest{Model: "m", Text: txt, ExcludeWorkers: all}))
	ce := wantCode(t, err, connect.CodeResourceExhausted)
	if !strings.Contains(ce.Message(), "excluded") || cpclient.HasDetail[*cartv1.PoolSaturated](ce, connect.CodeResourceExhausted) || cpclient.IsPoolSaturated(err) {
		t.Fatalf("all-excluded: %q %v, want no PoolSaturated detail (nothing to wait for)", ce.Message(), ce.Details())
	}
}

func TestRouteSaturated(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true})
	cmd := &cartv1.RaftCommand{Body: &cartv1.RaftCommand_UpsertWorker{UpsertWorker: &cartv1.UpsertWorkerCommand{Worker: &cartv1.WorkerSpec{Url: w1, MaxLoad: 2}}}}
	if _, err := cp.node.Apply(context.Background(), cmd); err != nil {
		t.Fatal(err)
	}
	rc := cp.router()
	route(t, rc, &cartv1.RouteRequest{Text: "a", DataplaneId: "dp1"})
	route(t, rc, &cartv1.RouteRequest{Text: "b", DataplaneId: "dp1"})
	_, err := rc.Route(context.Background(), connect.NewRequest(&cartv1.RouteRequest{Text: "c", DataplaneId: "dp1"}))
	ce := wantCode(t, err, connect.CodeResourceExhausted)
	if !strings.Contains(ce.Message(), "max_load") {
		t.Fatalf("saturated message = %q", ce.Message())
	}
	// Full, not empty: said in a detail, which is what a data plane reads.
	if !cpclient.IsPoolSaturated(err) || !cpclient.HasDetail[*cartv1.PoolSaturated](ce, connect.CodeResourceExhausted) {
		t.Fatalf("saturated answer without a PoolSaturated detail: %v", ce.Details())
	}
}

func TestLoadAccountingComplete(t *testing.T) {
	cp, rc := leaderWith(t, w1, w2)
	d := liveRoute(t, rc, text(40, 5))
	if got := cp.loads(t)[d.GetWorker()]; got != 1 {
		t.Fatalf("load after route = %d, want 1", got)
	}
	other := w1
	if d.GetWorker() == w1 {
		other = w2
	}
	// A completion naming the wrong worker settles nothing.
	if n := complete(t, rc, "dp1", &cartv1.Completion{Ticket: d.GetTicket(), Worker: other, Delivered: true}); n != 0 {
		t.Fatalf("completion with the wrong worker settled %d", n)
	}
	if n := complete(t, rc, "dp1", &cartv1.Completion{Ticket: 999999, Worker: d.GetWorker(), Delivered: true}); n != 0 {
		t.Fatalf("unknown ticket settled %d", n)
	}
	if got := cp.loads(t)[d.GetWorker()]; got != 1 {
		t.Fatalf("load after bogus completions = %d, want 1", got)
	}
	c := &cartv1.Completion{Ticket: d.GetTicket(), Worker: d.GetWorker(), Delivered: true, PromptTokens: 10, CachedTokens: 5}
	if n := complete(t, rc, "dp1", c); n != 1 {
		t.Fatalf("Complete settled %d, want 1", n)
	}
	if got := cp.loads(t)[d.GetWorker()]; got != 0 {
		t.Fatalf("load after Complete = %d, want 0", got)
	}
	if n := complete(t, rc, "dp1", c); n != 0 {
		t.Fatalf("second Complete of the same ticket settled %d, want 0", n)
	}
	if got := cp.loads(t)[d.GetWorker()]; got != 0 {
		t.Fatalf("load after second Complete = %d, want 0", got)
	}

	// Many decisions settled in one batch, one of them twice.
	var comps []*cartv1.Completion
	for i := range 5 {
		r := liveRoute(t, rc, text(40, 100+i))
		comps = append(comps, &cartv1.Completion{Ticket: r.GetTicket(), Worker: r.GetWorker(), Delivered: true})
	}
	comps = append(comps, comps[0])
	if n := complete(t, rc, "dp1", comps...); n != 5 {
		t.Fatalf("batch Complete settled %d, want 5", n)
	}
	for w, l := range cp.loads(t) {
		if l != 0 {
			t.Fatalf("load on %s after batch Complete = %d", w, l)
		}
	}
}

// Completions that ride with a Route call (RouteRequest.completions) are
// settled as Complete would settle them: on a unary call, on a stream
// call, and on a call the leader refuses.
func TestRouteSettlesItsRiders(t *testing.T) {
	cp, rc := leaderWith(t, w1, w2)
	rider := func(d *cartv1.RouteResponse) *cartv1.Completion {
		return &cartv1.Completion{Ticket: d.GetTicket(), Worker: d.GetWorker(), Delivered: true, PromptTokens: 10, CachedTokens: 5}
	}
	total := func() (n uint32) {
		for _, l := range cp.loads(t) {
			n += l
		}
		return n
	}
	var riders []*cartv1.Completion
	for i := range 3 {
		riders = append(riders, rider(liveRoute(t, rc, text(40, 200+i))))
	}
	d := route(t, rc, &cartv1.RouteRequest{Model: "m", Text: text(40, 210), DataplaneId: "dp1", Completions: riders})
	if n := total(); n != 1 {
		t.Fatalf("load %d after a call that carried 3 completions, want its own 1", n)
	}
	st := openStream(t, cp)
	call := routeCall(1, 211)
	call.GetRoute().DryRun = false
	call.GetRoute().Completions = []*cartv1.Completion{rider(d)}
	if err := st.Send(call); err != nil {
		t.Fatal(err)
	}
	got, _ := receiveAnswers(t, st, 1)
	streamed := got[1].GetRoute()
	if streamed.GetWorker() == "" || total() != 1 {
		t.Fatalf("stream call answered %v; load %d, want its own 1", got[1], total())
	}
	// Refused for listing too many workers: what it carried still stands.
	many := make([]string, maxListedWorkers+1)
	for i := range many {
		many[i] = fmt.Sprintf("http://w%d.test", i)
	}
	_, err := rc.Route(context.Background(), connect.NewRequest(&cartv1.RouteRequest{Model: "m", Text: text(40, 212), DataplaneId: "dp1",
		ExcludeWorkers: many, Completions: []*cartv1.Completion{rider(streamed)}}))
	wantCode(t, err, connect.CodeInvalidArgument)
	if n := total(); n != 0 {
		t.Fatalf("load %d after a refused call carried the last completion, want 0", n)
	}
}

func TestCompleteUndeliveredWithdrawsPlacement(t *testing.T) {
	cp, rc := leaderWith(t, w1, w2)
	txt := text(64, 6)
	hs := hashes("m", txt)
	d := liveRoute(t, rc, txt)
	if d.GetReason() != "cache_miss" {
		t.Fatalf("first route = %v", d)
	}
	// The placement is replicated in a batch.
	testkit.WaitFor(t, 5*time.Second, "PlaceBatch with the placement", func() bool {
		return placesOn(placementsOf(cp.node.placeBatches()), d.GetWorker(), hs)
	})
	if n := settle(t, rc, d, false); n != 1 {
		t.Fatalf("Complete(delivered=false) settled %d", n)
	}
	if got := cp.loads(t)[d.GetWorker()]; got != 0 {
		t.Fatalf("load after undelivered Complete = %d", got)
	}
	probe := route(t, rc, &cartv1.RouteRequest{Model: "m", Text: txt, DryRun: true})
	if probe.GetReason() == "cache_hit" {
		t.Fatalf("withdrawn placement still routes by cache: %v", probe)
	}
	testkit.WaitFor(t, 5*time.Second, "UnplaceBatch withdrawing the placement", func() bool {
		return placesOn(placementsOf(cp.node.unplaceBatches()), d.GetWorker(), hs)
	})
	probe = route(t, rc, &cartv1.RouteRequest{Model: "m", Text: txt, DryRun: true})
	if probe.GetReason() == "cache_hit" {
		t.Fatalf("withdrawn placement routes by cache after the unplace applied: %v", probe)
	}
}

// A request that went to a worker already holding its whole prefix placed
// nothing new; failing to deliver it must not withdraw the older placement.
func TestCompleteUndeliveredKeepsEarlierPlacement(t *testing.T) {
	cp, rc := leaderWith(t, w1, w2)
	txt := text(64, 7)
	a := liveRoute(t, rc, txt)
	settle(t, rc, a, true)
	b := liveRoute(t, rc, txt)
	if b.GetReason() != "cache_hit" {
		t.Fatalf("second route = %v", b)
	}
	settle(t, rc, b, false)
	// Barrier: a new placement after the completion is replicated in the
	// same window as any withdrawal it caused, or a later one.
	before := len(cp.node.placeBatches())
	liveRoute(t, rc, text(64, 98))
	testkit.WaitFor(t, 5*time.Second, "the marker's placement replicated", func() bool {
		for _, pb := range cp.node.placeBatches()[before:] {
			if len(pb.GetPlacements()) > 0 {
				return true
			}
		}
		return false
	})
	if u := cp.node.unplaceBatches(); len(u) != 0 {
		t.Fatalf("unplaced blocks the worker already held: %v", u)
	}
	c := route(t, rc, &cartv1.RouteRequest{Model: "m", Text: txt, DryRun: true})
	if c.GetReason() != "cache_hit" || c.GetWorker() != a.GetWorker() {
		t.Fatalf("after undelivered repeat = %v, want cache_hit on %s", c, a.GetWorker())
	}
}

// replayReason replays cp's replicated log on a fresh replica and
// returns the reason txt then routes with there: followers must end up with
// the index the leader has.
func replayReason(t *testing.T, cp *testCP, txt string) string {
	t.Helper()
	fresh := newTestCP(t, cpConfig{id: "replay", leader: true})
	for _, c := range cp.node.commands() {
		if _, err := fresh.node.Apply(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	return route(t, fresh.router(), &cartv1.RouteRequest{Model: "m", Text: txt, DryRun: true}).GetReason()
}

// A withdrawal and a new placement of the same prefix on the same worker in
// one batch window must replicate with the new placement standing. Windows
// are cut by hand (the interval is an hour) so the test does not depend on
// timing.
func TestUnplaceThenPlaceInOneWindow(t *testing.T) {
	for _, crossWindow := range []bool{false, true} {
		t.Run(fmt.Sprintf("placed in an earlier window=%v", crossWindow), func(t *testing.T) {
			cp, rc := heldWith(t, w1)
			txt := text(64, 8)
			a := liveRoute(t, rc, txt)
			if crossWindow {
				cp.flushBatch()
				if n := len(cp.node.placeBatches()); n != 1 {
					t.Fatalf("%d place batches after the first window", n)
				}
			}
			complete(t, rc, "dp1", &cartv1.Completion{Ticket: a.GetTicket(), Worker: w1, Delivered: false})
			b := liveRoute(t, rc, txt)
			if b.GetReason() != "cache_miss" {
				t.Fatalf("route after withdrawal = %v, want cache_miss", b)
			}
			if d := route(t, rc, &cartv1.RouteRequest{Model: "m", Text: txt, DryRun: true}); d.GetReason() != "cache_hit" {
				t.Fatalf("before the flush: %v, want cache_hit", d)
			}
			cp.flushBatch()
			if crossWindow && len(cp.node.unplaceBatches()) != 1 {
				t.Fatalf("unplace batches = %v, want 1", cp.node.unplaceBatches())
			}
			if d := route(t, rc, &cartv1.RouteRequest{Model: "m", Text: txt, DryRun: true}); d.GetReason() != "cache_hit" {
				t.Fatalf("after the flush: %v, want cache_hit (the replicated batches undid a live placement)", d)
			}
			wantReason(t, replayReason(t, cp, txt), "cache_hit", "replayed log")
		})
	}
}

// A placement withdrawn within its own window never reaches the log.
func TestPlaceThenUnplaceInOneWindow(t *testing.T) {
	cp, rc := heldWith(t, w1, w2)
	txt, keep := text(64, 11), text(64, 12)
	a := liveRoute(t, rc, txt)
	liveRoute(t, rc, keep)
	settle(t, rc, a, false)
	cp.flushBatch()
	if u := cp.node.unplaceBatches(); len(u) != 0 {
		t.Fatalf("unplace batches = %v, want none", u)
	}
	if p := cp.node.placeBatches(); len(p) != 1 || len(p[0].GetPlacements()) != 1 {
		t.Fatalf("place batches = %v, want only the kept placement", p)
	}
	wantReason(t, replayReason(t, cp, txt), "cache_miss", "replayed log, withdrawn prefix")
	wantReason(t, replayReason(t, cp, keep), "cache_hit", "replayed log, kept prefix")
}

func TestSyncReconcilesAbsoluteCounts(t *testing.T) {
	cp, rc := leaderWith(t, w1, w2)
	check := func(what string, want map[string]uint32) {
		t.Helper()
		got := cp.loads(t)
		for _, w := range []string{w1, w2} {
			if got[w] != want[w] {
				t.Fatalf("%s: loads = %v, want %v", what, got, want)
			}
		}
	}
	resp := syncLoads(t, rc, "dp1", map[string]uint32{w1: 3})
	check("report 3", map[string]uint32{w1: 3})
	if resp.GetLeaderId() != "n1" || resp.GetLeaderUrl() != cp.url || resp.GetBlockChars() != testBlockChars || len(resp.GetWorkers()) != 2 || resp.GetWorkersVersion() == 0 {
		t.Fatalf("Sync response = %v", resp)
	}
	for _, w := range resp.GetWorkers() {
		if !w.GetHealthy() {
			t.Fatalf("worker %s unhealthy in Sync", w.GetUrl())
		}
		if w.GetUrl() == w1 && w.GetLoad() != 3 {
			t.Fatalf("Sync reports load %d for w1, want 3", w.GetLoad())
		}
	}
	syncLoads(t, rc, "dp1", map[string]uint32{w1: 0})
	check("report 0", nil)
	syncLoads(t, rc, "dp1", map[string]uint32{w1: 2, w2: 1})
	check("report 2,1", map[string]uint32{w1: 2, w2: 1})
	syncLoads(t, rc, "dp1", nil)
	check("report nothing", nil)

	// Two data planes add up; one's report does not touch the other's.
	syncLoads(t, rc, "dp1", map[string]uint32{w1: 2})
	syncLoads(t, rc, "dp2", map[string]uint32{w1: 1, w2: 4})
	check("two data planes", map[string]uint32{w1: 3, w2: 4})
	syncLoads(t, rc, "dp1", nil)
	check("dp1 idle", map[string]uint32{w1: 1, w2: 4})
	syncLoads(t, rc, "dp2", map[string]uint32{"http://ghost.test": 5})
	check("dp2 reports only an unknown worker", nil)
}

// A Sync reporting a request finished can reach the leader before the
// request's Complete (the data plane batches completions). The late Complete
// must not take the load a second time — in particular not from another
// data plane's share.
func TestCompleteAfterSyncDoesNotDoubleRelease(t *testing.T) {
	cp, rc := leaderWith(t, w1)
	a := route(t, rc, &cartv1.RouteRequest{Text: "x", DataplaneId: "dp1"})
	route(t, rc, &cartv1.RouteRequest{Text: "y", DataplaneId: "dp2"})
	if got := cp.loads(t)[w1]; got != 2 {
		t.Fatalf("load = %d, want 2", got)
	}
	syncLoads(t, rc, "dp1", nil) // dp1's request finished
	if got := cp.loads(t)[w1]; got != 1 {
		t.Fatalf("load after dp1 sync = %d, want 1", got)
	}
	complete(t, rc, "dp1", &cartv1.Completion{Ticket: a.GetTicket(), Worker: w1, Delivered: true})
	if got := cp.loads(t)[w1]; got != 1 {
		t.Fatalf("load after dp1's late Complete = %d, want 1 (dp2's request is still in flight)", got)
	}
}

// With a fence, the same Sync says dp1's request finished but its report
// is still on its way: the leader keeps counting it until the report comes,
// so neither data plane's share is ever under-counted.
func TestSyncFenceKeepsAnUnreportedRequest(t *testing.T) {
	cp, rc := leaderWith(t, w1)
	a := route(t, rc, &cartv1.RouteRequest{Text: "x", DataplaneId: "dp1", RouteId: 10})
	route(t, rc, &cartv1.RouteRequest{Text: "y", DataplaneId: "dp2", RouteId: 1})
	req := &cartv1.SyncRequest{DataplaneId: "dp1", FirstRouteId: 10, SyncSeq: 1, LastRouteId: 10, UnsettledTickets: []uint64{a.GetTicket()}, DoneSeq: 1}
	if _, err := rc.Sync(context.Background(), connect.NewRequest(req)); err != nil {
		t.Fatal(err)
	}
	if got := cp.loads(t)[w1]; got != 2 {
		t.Fatalf("load after dp1's fenced sync = %d, want 2 (its report is still to come)", got)
	}
	complete(t, rc, "dp1", &cartv1.Completion{Ticket: a.GetTicket(), Worker: w1, Delivered: true, DoneSeq: 1})
	if got := cp.loads(t)[w1]; got != 1 {
		t.Fatalf("load after dp1's report = %d, want 1 (dp2's request)", got)
	}
}

func TestLoadLeaseExpiry(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true, dec: func(o *decider.Options) { o.LoadLease = 500 * time.Millisecond }})
	cp.addWorkers(t, w1, w2)
	rc := cp.router()
	aliveSync := func(ctx context.Context) error {
		req := &cartv1.SyncRequest{DataplaneId: "alive", Loads: []*cartv1.WorkerLoad{{Worker: w1, InFlight: 1}}}
		_, err := rc.Sync(ctx, connect.NewRequest(req))
		return err
	}
	if err := aliveSync(context.Background()); err != nil {
		t.Fatal(err)
	}
	gone := route(t, rc, &cartv1.RouteRequest{Text: "x", DataplaneId: "gone", ExcludeWorkers: []string{w2}})
	syncLoads(t, rc, "gone", map[string]uint32{w1: 2, w2: 1})
	if l := cp.loads(t); l[w1] != 3 || l[w2] != 1 {
		t.Fatalf("loads = %v, want w1 3, w2 1", l)
	}

	inBackground(t, 25*time.Millisecond, func(ctx context.Context) { _ = aliveSync(ctx) })

	status := func() *cartv1.ClusterStatusResponse {
		st, err := cp.admin().ClusterStatus(context.Background(), connect.NewRequest(&cartv1.ClusterStatusRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		return st.Msg
	}
	testkit.WaitFor(t, 5*time.Second, "gone's load leaves the view, alive's stays", func() bool {
		l := cp.loads(t)
		return l[w1] == 1 && l[w2] == 0 && status().GetDataplanes() == 1
	})
	// Its tickets went with it.
	if n := complete(t, rc, "gone", &cartv1.Completion{Ticket: gone.GetTicket(), Worker: gone.GetWorker(), Delivered: true}); n != 0 {
		t.Fatalf("expired data plane's ticket settled %d", n)
	}
	if got := cp.loads(t)[w1]; got != 1 {
		t.Fatalf("load after expired Complete = %d, want 1", got)
	}
}

func TestPlacementBatching(t *testing.T) {
	const interval = 200 * time.Millisecond
	cp := newTestCP(t, cpConfig{leader: true, opts: func(o *Options) { o.PlacementBatch = interval }})
	cp.addWorkers(t, w1, w2, w3)
	rc := cp.router()
	const n, par = 60, 6
	type placed struct {
		worker string
		hashes []uint64
	}
	var mu sync.Mutex
	var want []placed
	start := time.Now()
	var wg sync.WaitGroup
	for g := range par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += par {
				txt := text(48, 1000+i)
				resp, err := rc.Route(context.Background(), connect.NewRequest(&cartv1.RouteRequest{Model: "m", Text: txt, DataplaneId: "dp1"}))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				want = append(want, placed{resp.Msg.GetWorker(), hashes("m", txt)})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if t.Failed() {
		return
	}
	total := func() int { return len(placementsOf(cp.node.placeBatches())) }
	testkit.WaitFor(t, 5*time.Second, "all placements replicated", func() bool { return total() >= n })
	batches := cp.node.placeBatches()
	if limit := int(elapsed/interval) + 3; len(batches) > limit || len(batches) >= n/2 {
		t.Fatalf("%d routes in %v made %d PlaceBatch commands (want at most %d)", n, elapsed, len(batches), limit)
	}
	if got := total(); got != n {
		t.Fatalf("replicated %d placements, want %d", got, n)
	}
	for _, w := range want {
		found := false
		for _, b := range batches {
			for _, p := range b.GetPlacements() {
				if p.GetWorker() == w.worker && slices.Equal(p.GetBlockHashes(), w.hashes) && p.GetAtUnixNanos() > 0 {
					found = true
				}
			}
		}
		if !found {
			t.Fatalf("placement of %v on %s not replicated", w.hashes, w.worker)
		}
	}
	for _, c := range cp.node.commands() {
		if c.GetPlaceBatch() != nil && !c.GetIgnorable() {
			t.Fatal("PlaceBatch is not flagged ignorable")
		}
	}
}

func TestPlacementMaxFlushesEarly(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true, opts: func(o *Options) {
		o.PlacementBatch = time.Hour
		o.PlacementMax = 10
	}})
	cp.addWorkers(t, w1, w2)
	rc := cp.router()
	for i := range 25 {
		liveRoute(t, rc, text(32, 2000+i))
	}
	testkit.WaitFor(t, 5*time.Second, "full batches flushed before the interval", func() bool {
		return len(placementsOf(cp.node.placeBatches())) >= 20
	})
}

// Stopping the leader loops hands the last window to Raft.
func TestBatcherFlushesOnStepDown(t *testing.T) {
	cp := newHeldCP(t)
	cp.addWorkers(t, w1)
	route(t, cp.router(), &cartv1.RouteRequest{Model: "m", Text: text(32, 9), DataplaneId: "dp1"})
	if len(cp.node.placeBatches()) != 0 {
		t.Fatal("flushed before the interval")
	}
	cp.core.OnLeadership(false)
	if len(cp.node.placeBatches()) != 1 {
		t.Fatalf("step-down flushed %d batches, want 1", len(cp.node.placeBatches()))
	}
}

func TestLeaderChangeResetsSoftState(t *testing.T) {
	cp, rc := leaderWith(t, w1, w2)
	txt := text(64, 10)
	a := liveRoute(t, rc, txt)
	syncLoads(t, rc, "dp2", map[string]uint32{w1: 2, w2: 2})
	testkit.WaitFor(t, 5*time.Second, "placement replicated", func() bool { return len(cp.node.placeBatches()) > 0 })
	status := func() *cartv1.ClusterStatusResponse {
		st, err := cp.admin().ClusterStatus(context.Background(), connect.NewRequest(&cartv1.ClusterStatusRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		return st.Msg
	}
	if st := status(); st.GetDataplanes() != 2 {
		t.Fatalf("data planes = %d", st.GetDataplanes())
	}

	cp.core.OnLeadership(false)
	// Raft says leader, but the service has not started leading (barrier
	// pending): it must refuse rather than decide from stale soft state.
	_, err := rc.Route(context.Background(), connect.NewRequest(&cartv1.RouteRequest{Text: "z"}))
	wantCode(t, err, connect.CodeUnavailable)
	cp.core.OnLeadership(true)

	for w, l := range cp.loads(t) {
		if l != 0 {
			t.Fatalf("load on %s survived the leader change: %d", w, l)
		}
	}
	if st := status(); st.GetDataplanes() != 0 || st.GetHealthyWorkers() != 2 {
		t.Fatalf("after leader change: %v", st)
	}
	if n := settle(t, rc, a, true); n != 0 {
		t.Fatalf("earlier leader's ticket settled %d", n)
	}
	// The index is replicated state, not soft state: it survives.
	if d := route(t, rc, &cartv1.RouteRequest{Model: "m", Text: txt, DryRun: true}); d.GetReason() != "cache_hit" || d.GetWorker() != a.GetWorker() {
		t.Fatalf("after leader change: %v, want cache_hit on %s", d, a.GetWorker())
	}
	// Tickets restart but never collide with a settled one in a way that
	// matters: a new decision settles normally.
	b := liveRoute(t, rc, txt)
	if n := settle(t, rc, b, true); n != 1 {
		t.Fatalf("new leader's ticket settled %d", n)
	}
}

func TestConcurrentRouteCompleteSync(t *testing.T) {
	cp, rc := leaderWith(t, w1, w2, w3)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dp := fmt.Sprintf("dp%d", g)
			for i := range 40 {
				resp, err := rc.Route(context.Background(), connect.NewRequest(&cartv1.RouteRequest{Model: "m", Text: text(48, i%7), DataplaneId: dp}))
				if err != nil {
					t.Error(err)
					return
				}
				_, err = rc.Complete(context.Background(), connect.NewRequest(&cartv1.CompleteRequest{DataplaneId: dp, Completions: []*cartv1.Completion{
					{Ticket: resp.Msg.GetTicket(), Worker: resp.Msg.GetWorker(), Delivered: i%3 != 0},
				}}))
				if err != nil {
					t.Error(err)
					return
				}
				if i%10 == 0 {
					if _, err := rc.Sync(context.Background(), connect.NewRequest(&cartv1.SyncRequest{DataplaneId: dp})); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	for w, l := range cp.loads(t) {
		if l != 0 {
			t.Fatalf("load on %s after every decision settled: %d", w, l)
		}
	}
}

// A completion whose usage had no cache fields (cached_tokens -1) is
// unknown: the leader's accuracy counters ignore it, and count the next
// completion that does report them.
func TestCompleteWithUnknownCacheIsNotScored(t *testing.T) {
	cp, rc := leaderWith(t, w1)
	accuracy := func() (predicted, actual uint64) {
		t.Helper()
		list, err := cp.admin().ListWorkers(context.Background(), connect.NewRequest(&cartv1.ListWorkersRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		w := list.Msg.GetWorkers()[0]
		return w.GetPredictedCachedTokens(), w.GetActualCachedTokens()
	}
	req := &cartv1.RouteRequest{Model: "m", Text: text(40, 7), DataplaneId: "dp1"}
	settle := func(cached int32) {
		t.Helper()
		d := route(t, rc, req)
		if n := complete(t, rc, "dp1", &cartv1.Completion{Ticket: d.GetTicket(), Worker: d.GetWorker(), Delivered: true, PromptTokens: 100, CachedTokens: cached}); n != 1 {
			t.Fatalf("settled %d", n)
		}
	}
	settle(-1) // placed
	settle(-1) // predicted a hit, nothing known
	if p, a := accuracy(); p != 0 || a != 0 {
		t.Fatalf("unknown usage scored: predicted %d actual %d", p, a)
	}
	settle(90)
	if p, a := accuracy(); p == 0 || a != 90 {
		t.Fatalf("known usage not scored: predicted %d actual %d", p, a)
	}
}

// The leader refuses a Sync answer larger than the data planes read, with
// the reason and an error log, warns past half of it, and exports the
// answer's size.
func TestSyncAnswerSizeIsChecked(t *testing.T) {
	var logs testkit.SyncBuffer
	var skew atomic.Int64 // the test moves the leader's clock ahead
	const limit = 4000
	cp := newTestCP(t, cpConfig{leader: true, opts: func(o *Options) {
		o.MaxSyncAnswerBytes = limit
		o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		o.Now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	}})
	rc := cp.router()
	sync := func() (*cartv1.SyncResponse, error) {
		r, err := rc.Sync(context.Background(), connect.NewRequest(&cartv1.SyncRequest{DataplaneId: "dp1"}))
		if err != nil {
			return nil, err
		}
		return r.Msg, nil
	}
	gauge := func() int {
		var m dto.Metric
		if err := cp.core.metrics.syncBytes.Write(&m); err != nil {
			t.Fatal(err)
		}
		return int(m.GetGauge().GetValue())
	}
	// The gauge's help names the limit this node enforces.
	if d := cp.core.metrics.syncBytes.Desc().String(); !strings.Contains(d, fmt.Sprintf("read at most %d bytes", limit)) {
		t.Errorf("gauge help %s does not name the limit %d", d, limit)
	}
	n := 0
	add := func(k int) {
		for range k {
			n++
			cp.addWorkers(t, fmt.Sprintf("http://worker-%04d.pool.example.internal:8000", n))
		}
	}
	add(5)
	resp, err := sync()
	if err != nil {
		t.Fatalf("small Sync: %v", err)
	}
	if got, want := gauge(), proto.Size(resp); got != want || got > limit/2 {
		t.Fatalf("size gauge %d, want the answer's %d (under half the limit)", got, want)
	}
	if strings.Contains(logs.String(), "the Sync answer") {
		t.Fatalf("logged for a small answer: %s", logs.String())
	}
	for gauge() <= limit/2 {
		add(5)
		if _, err := sync(); err != nil {
			t.Fatalf("Sync of %d workers, %d bytes: %v", n, gauge(), err)
		}
	}
	if !strings.Contains(logs.String(), "over half the limit") {
		t.Fatalf("no warning at %d of %d bytes: %q", gauge(), limit, logs.String())
	}
	for gauge() <= limit {
		add(5)
		_, err = sync()
	}
	if e := wantCode(t, err, connect.CodeResourceExhausted); !strings.Contains(e.Message(), fmt.Sprintf("data planes read at most %d", limit)) {
		t.Fatalf("over the limit: %v", err)
	}
	// The warning was logged less than ten seconds ago: one line stands
	// for ten seconds of syncs.
	if strings.Contains(logs.String(), "data planes cannot sync") {
		t.Errorf("logged again within ten seconds: %q", logs.String())
	}
	skew.Add(int64(11 * time.Second))
	if _, err := sync(); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("over the limit, later: %v", err)
	}
	if !strings.Contains(logs.String(), "data planes cannot sync") {
		t.Errorf("no error logged ten seconds on: %q", logs.String())
	}
}
