package state

import (
	"testing"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

func touchBatch(touches, withdrawals, placements []*cartv1.Placement) *cartv1.RaftCommand {
	return &cartv1.RaftCommand{Ignorable: true, Body: &cartv1.RaftCommand_PlaceBatch{PlaceBatch: &cartv1.PlaceBatchCommand{
		Touches: touches, Withdrawals: withdrawals, Placements: placements}}}
}

// holdingAt is worker's holding time of h (-1: not held).
func holdingAt(st *State, eng *engine.Engine, worker string, h uint64) int64 {
	at := int64(-1)
	locked(st, func() {
		if id, ok := eng.WorkerIDOf(worker); ok {
			if a, ok := eng.Index().HolderAt(h, index.WorkerID(id)); ok {
				at = a
			}
		}
	})
	return at
}

// A touch refreshes the time of the leading blocks this node holds for the
// worker and adds no holding: block 3 (never placed here: the leader
// withdrew its placement in the window it was made, so it never reached
// the log) stays unheld, and so does block 5, past the gap at 4. A touch
// of a worker this node does not know is skipped.
func TestTouchesRefreshOnly(t *testing.T) {
	st, eng := newTestState()
	a := &testApplier{t: t, st: st}
	a.apply(setWorkers("http://w1", "http://w2"))
	a.apply(placeBatch(
		&cartv1.Placement{Worker: "http://w1", BlockHashes: []uint64{1, 2}, AtUnixNanos: 100},
		&cartv1.Placement{Worker: "http://w2", BlockHashes: []uint64{1}, AtUnixNanos: 100},
		&cartv1.Placement{Worker: "http://w1", BlockHashes: []uint64{5}, AtUnixNanos: 100},
	))
	a.apply(touchBatch([]*cartv1.Placement{
		{Worker: "http://w1", BlockHashes: []uint64{1, 2, 3, 4, 5}, AtUnixNanos: 500},
		{Worker: "http://gone", BlockHashes: []uint64{1, 2}, AtUnixNanos: 600},
	}, nil, nil))
	for h, want := range map[uint64]int64{1: 500, 2: 500, 3: -1, 4: -1, 5: 100} {
		if at := holdingAt(st, eng, "http://w1", h); at != want {
			t.Fatalf("w1's block %d held since %d, want %d", h, at, want)
		}
	}
	if at := holdingAt(st, eng, "http://w2", 1); at != 100 {
		t.Fatalf("w2's block 1 held since %d: a touch of w1 changed it", at)
	}
}

// Touches apply before the window's withdrawals: they say what the leader
// held when it decided, and a withdrawal later in the window took it back.
func TestTouchesApplyBeforeWithdrawals(t *testing.T) {
	st, eng := newTestState()
	a := &testApplier{t: t, st: st}
	a.apply(setWorkers("http://w1"))
	a.apply(placeBatch(&cartv1.Placement{Worker: "http://w1", BlockHashes: []uint64{1, 2, 3}, AtUnixNanos: 100}))
	w := []*cartv1.Placement{{Worker: "http://w1", BlockHashes: []uint64{2}, AtUnixNanos: 100}}
	touch := []*cartv1.Placement{{Worker: "http://w1", BlockHashes: []uint64{1, 2, 3}, AtUnixNanos: 200}}
	a.apply(touchBatch(touch, w, nil))
	if at := holdingAt(st, eng, "http://w1", 2); at != -1 {
		t.Fatalf("withdrawn block held since %d after the window", at)
	}
	// Block 3, past the withdrawn one, is refreshed only if the touch came
	// first: applied after the withdrawal, it would stop at the gap.
	for h, want := range map[uint64]int64{1: 200, 3: 200} {
		if at := holdingAt(st, eng, "http://w1", h); at != want {
			t.Fatalf("touched block %d held since %d, want %d", h, at, want)
		}
	}
}

// A batch written before touches existed applies as it always did:
// recency stays that of the placement.
func TestBatchWithoutTouchesKeepsRecency(t *testing.T) {
	st, eng := newTestState()
	a := &testApplier{t: t, st: st}
	a.apply(setWorkers("http://w1"))
	a.apply(placeBatch(&cartv1.Placement{Worker: "http://w1", BlockHashes: []uint64{1, 2}, AtUnixNanos: 100}))
	a.apply(placeBatch(&cartv1.Placement{Worker: "http://w1", BlockHashes: []uint64{3}, AtUnixNanos: 300}))
	for h, want := range map[uint64]int64{1: 100, 2: 100, 3: 300} {
		if at := holdingAt(st, eng, "http://w1", h); at != want {
			t.Fatalf("block %d held since %d, want %d", h, at, want)
		}
	}
}
