package service

import (
	"context"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
)

func (cp *testCP) unsettled() int { return cp.dec.Stats().Unsettled }

// holds reports whether the leader's index records worker w for the last
// block of the text.
func (cp *testCP) holds(model, txt, w string) bool {
	hs := hashes(model, txt)
	held := false
	cp.dec.Do(decider.OpRead, func(eng *engine.Engine) {
		if id, ok := eng.WorkerIDOf(w); ok {
			_, held = eng.Index().HolderAt(hs[len(hs)-1], index.WorkerID(id))
		}
	})
	return held
}

// dropped reads cart_cp_tickets_dropped_total{cause} from the node's
// registry, as a scrape would.
func (cp *testCP) dropped(cause decider.DropCause) float64 {
	mfs, err := cp.core.metrics.reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "cart_cp_tickets_dropped_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "cause" && l.GetValue() == cause.String() {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	panic("cart_cp_tickets_dropped_total{cause=" + cause.String() + "} not exported")
}

// A data plane that gave up waiting for Route reports the call's id; the
// leader releases the load and withdraws the placement of the decision it
// had made, instead of keeping both until an hour-long timeout.
func TestAbandonedRouteIsSettled(t *testing.T) {
	cp, rc := leaderWith(t, w1)
	txt := text(64, 1)
	route(t, rc, &cartv1.RouteRequest{Model: "m", Text: txt, DataplaneId: "dp1", RouteId: 42})
	if l := cp.loads(t)[w1]; l != 1 || !cp.holds("m", txt, w1) || cp.unsettled() != 1 {
		t.Fatalf("after Route: load %d, placed %v, tickets %d", l, cp.holds("m", txt, w1), cp.unsettled())
	}
	// Another data plane cannot abandon dp1's call.
	if n := complete(t, rc, "dp2", &cartv1.Completion{Abandoned: true, RouteId: 42}); n != 0 {
		t.Fatalf("dp2 settled dp1's decision (%d)", n)
	}
	if n := complete(t, rc, "dp1", &cartv1.Completion{Abandoned: true, RouteId: 42}); n != 1 {
		t.Fatalf("abandoned call settled %d, want 1", n)
	}
	if l := cp.loads(t)[w1]; l != 0 || cp.holds("m", txt, w1) || cp.unsettled() != 0 {
		t.Fatalf("after abandon: load %d, placed %v, tickets %d", l, cp.holds("m", txt, w1), cp.unsettled())
	}
	// Followers end up without the placement: either it never left the
	// batcher, or its withdrawal follows it.
	last := hashes("m", txt)[len(hashes("m", txt))-1]
	testkit.WaitFor(t, 5*time.Second, "replicated placements and withdrawals balance", func() bool {
		placed, withdrawn := 0, 0
		for _, b := range cp.node.placeBatches() {
			for _, p := range b.GetPlacements() {
				if slices.Contains(p.GetBlockHashes(), last) {
					placed++
				}
			}
			for _, p := range b.GetWithdrawals() {
				if slices.Contains(p.GetBlockHashes(), last) {
					withdrawn++
				}
			}
		}
		return placed == withdrawn
	})
	if n := complete(t, rc, "dp1", &cartv1.Completion{Abandoned: true, RouteId: 42}); n != 0 {
		t.Fatalf("a second report settled %d", n)
	}
	if got := cp.dropped(decider.DropAbandoned); got != 1 {
		t.Fatalf("abandoned drops = %v, want 1", got)
	}
}

// A Route whose caller's deadline passed while the leader decided is undone
// at once: the caller has routed elsewhere and will never settle it.
func TestRoutePastCallerDeadlineIsUndone(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true})
	cp.addWorkers(t, w1)
	txt := text(64, 2)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := cp.core.Router().Route(ctx, connect.NewRequest(&cartv1.RouteRequest{Model: "m", Text: txt, DataplaneId: "dp1", RouteId: 1}))
	wantCode(t, err, connect.CodeDeadlineExceeded)
	if l := cp.loads(t)[w1]; l != 0 || cp.holds("m", txt, w1) || cp.unsettled() != 0 {
		t.Fatalf("after a Route nobody waited for: load %d, placed %v, tickets %d", l, cp.holds("m", txt, w1), cp.unsettled())
	}
}

// Past the load lease, a ticket is kept only while its data plane still
// counts a request in flight on that worker; the rest are settled as
// undelivered (placement withdrawn).
func TestTicketLifetimeFollowsLease(t *testing.T) {
	const lease = 300 * time.Millisecond
	cp := newTestCP(t, cpConfig{leader: true, dec: func(o *decider.Options) { o.LoadLease = lease }})
	cp.addWorkers(t, w1)
	rc := cp.router()
	busyTxt, quietTxt := text(64, 3), text(64, 4)
	busy := route(t, rc, &cartv1.RouteRequest{Model: "m", Text: busyTxt, DataplaneId: "busy"})
	route(t, rc, &cartv1.RouteRequest{Model: "m", Text: quietTxt, DataplaneId: "quiet", RouteId: 9})

	// Both data planes stay alive; "busy" still has its request in
	// flight, "quiet" never used its answer (it arrived too late).
	inBackground(t, lease/6, func(ctx context.Context) {
		_, _ = rc.Sync(ctx, connect.NewRequest(&cartv1.SyncRequest{DataplaneId: "busy", Loads: []*cartv1.WorkerLoad{{Worker: w1, InFlight: 1}}}))
		_, _ = rc.Sync(ctx, connect.NewRequest(&cartv1.SyncRequest{DataplaneId: "quiet"}))
	})

	testkit.WaitFor(t, 5*time.Second, "the unused ticket is settled after the lease", func() bool { return cp.unsettled() == 1 })
	if cp.holds("m", quietTxt, w1) {
		t.Fatal("the unused decision's placement was not withdrawn")
	}
	if !cp.holds("m", busyTxt, w1) {
		t.Fatal("the placement of a request still in flight was withdrawn")
	}
	if got := cp.dropped(decider.DropStale); got != 1 {
		t.Fatalf("stale drops = %v, want 1", got)
	}
	// The live one outlasts the lease and settles normally.
	start := time.Now()
	testkit.WaitFor(t, 5*time.Second, "two leases pass", func() bool { return time.Since(start) > 2*lease })
	if n := complete(t, rc, "busy", &cartv1.Completion{Ticket: busy.GetTicket(), Worker: w1, Delivered: true}); n != 1 {
		t.Fatalf("the in-flight ticket settled %d after the lease, want 1", n)
	}
}

// At max tickets, the oldest is settled as undelivered: its load released
// and its placement withdrawn.
func TestTicketCapDropsOldest(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true, dec: func(o *decider.Options) { o.MaxTickets = 3 }})
	cp.addWorkers(t, w1)
	rc := cp.router()
	var got []*cartv1.RouteResponse
	for i := range 5 {
		got = append(got, liveRoute(t, rc, text(64, 10+i)))
	}
	if n := cp.unsettled(); n != 3 {
		t.Fatalf("unsettled tickets = %d, want the cap 3", n)
	}
	if l := cp.loads(t)[w1]; l != 3 {
		t.Fatalf("load = %d, want 3 (the two dropped decisions released)", l)
	}
	for i := range 2 {
		if cp.holds("m", text(64, 10+i), w1) {
			t.Fatalf("dropped decision %d kept its placement", i)
		}
		if n := complete(t, rc, "dp1", &cartv1.Completion{Ticket: got[i].GetTicket(), Worker: w1, Delivered: true}); n != 0 {
			t.Fatalf("dropped ticket %d settled %d", i, n)
		}
	}
	for i := 2; i < 5; i++ {
		if !cp.holds("m", text(64, 10+i), w1) {
			t.Fatalf("live decision %d lost its placement", i)
		}
		if n := complete(t, rc, "dp1", &cartv1.Completion{Ticket: got[i].GetTicket(), Worker: w1, Delivered: true}); n != 1 {
			t.Fatalf("live ticket %d settled %d", i, n)
		}
	}
	if got := cp.dropped(decider.DropCap); got != 2 {
		t.Fatalf("cap drops = %v, want 2", got)
	}
	if l := cp.loads(t)[w1]; l != 0 {
		t.Fatalf("load after settling = %d, want 0", l)
	}
}
