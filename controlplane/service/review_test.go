package service

import (
	"context"
	"testing"

	"connectrpc.com/connect"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// A worker removed and added again starts with load 0 in the engine; the
// data planes' counts must be folded back in, not lost.
func TestLoadSurvivesWorkerRemoveAndReAdd(t *testing.T) {
	cp, rc := leaderWith(t, w1, w2)
	syncLoads(t, rc, "dp1", map[string]uint32{w1: 3})
	ctx := context.Background()
	if _, err := cp.admin().RemoveWorker(ctx, connect.NewRequest(&cartv1.RemoveWorkerRequest{Url: w1})); err != nil {
		t.Fatal(err)
	}
	cp.addWorkers(t, w1)
	syncLoads(t, rc, "dp1", map[string]uint32{w1: 3})
	if got := cp.loads(t)[w1]; got != 3 {
		t.Fatalf("load after remove + re-add = %d, want the 3 the data plane reports", got)
	}
}

// A data plane can settle only its own tickets.
func TestCompleteOnlySettlesOwnTickets(t *testing.T) {
	_, rc := leaderWith(t, w1)
	d := liveRoute(t, rc, text(64, 1))
	if n := complete(t, rc, "dp2", &cartv1.Completion{Ticket: d.GetTicket(), Worker: d.GetWorker(), Delivered: true}); n != 0 {
		t.Fatalf("dp2 settled dp1's ticket")
	}
	if n := settle(t, rc, d, true); n != 1 {
		t.Fatalf("dp1 could not settle its own ticket")
	}
}
