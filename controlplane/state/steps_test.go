package state

import (
	"testing"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

func sizedPlacements(sizes ...int) []placement {
	var ps []placement
	for i, n := range sizes {
		ps = append(ps, placement{worker: "w", hashes: make([]uint64, n), at: int64(i)})
	}
	return ps
}

// A batch is applied in steps bounded by blocks as well as placements:
// every placement exactly once, in order, no step over the block budget
// unless it is a single oversized placement.
func TestPlacementStepsBoundBlocksPerLockHold(t *testing.T) {
	b := applyBlockBudget
	for _, tc := range []struct {
		name  string
		sizes []int
		want  []int // placements per step
	}{
		{"empty", nil, nil},
		{"small ones by count", repeat(70, 1), []int{placementChunk, placementChunk, 70 - 2*placementChunk}},
		{"long prompts by blocks", repeat(8, b/3), []int{3, 3, 2}},
		{"exact budget", []int{b / 2, b / 2, 1}, []int{2, 1}},
		{"oversized alone", []int{10, b + 5, 10}, []int{1, 1, 1}},
		{"zero-block placements", repeat(40, 0), []int{placementChunk, 40 - placementChunk}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ps := sizedPlacements(tc.sizes...)
			var got []int
			next := 0
			for step := range placementSteps(ps) {
				blocks := 0
				for _, p := range step {
					if p.at != ps[next].at {
						t.Fatalf("placement %d out of order", next)
					}
					next++
					blocks += len(p.hashes)
				}
				if len(step) > 1 && blocks > b {
					t.Errorf("step of %d placements holds %d blocks, budget %d", len(step), blocks, b)
				}
				got = append(got, len(step))
			}
			if next != len(ps) {
				t.Fatalf("applied %d of %d placements", next, len(ps))
			}
			if len(got) != len(tc.want) {
				t.Fatalf("steps %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("steps %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func repeat(n, size int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = size
	}
	return out
}

// An UnplaceBatch spanning many steps withdraws every placement it lists,
// and only those, and advances the applied index once.
func TestUnplaceBatchInSteps(t *testing.T) {
	st, eng := newTestState()
	a := &testApplier{t: t, st: st}
	a.apply(setWorkers("http://w0:1", "http://w1:1"))
	var ps, un []*cartv1.Placement
	for i := range 3 * placementChunk {
		h := []uint64{uint64(i)*1000 + 1, uint64(i)*1000 + 2}
		ps = append(ps, &cartv1.Placement{Worker: "http://w0:1", BlockHashes: h, AtUnixNanos: 1})
		ps = append(ps, &cartv1.Placement{Worker: "http://w1:1", BlockHashes: h[:1], AtUnixNanos: 1})
		un = append(un, &cartv1.Placement{Worker: "http://w0:1", BlockHashes: h})
	}
	a.apply(placeBatch(ps...))
	res := a.apply(&cartv1.RaftCommand{Body: &cartv1.RaftCommand_UnplaceBatch{UnplaceBatch: &cartv1.UnplaceBatchCommand{Placements: un}}})
	if res.WorkersVersion != 1 || st.Applied() != a.i {
		t.Fatalf("result %+v applied %d, want version 1 applied %d", res, st.Applied(), a.i)
	}
	// Only w1's one-block placements remain.
	if n := eng.Index().Len(); n != 3*placementChunk {
		t.Fatalf("index holds %d entries, want %d", n, 3*placementChunk)
	}
	for i := range 3 * placementChunk {
		got := lookupByURL(st, eng, []uint64{uint64(i)*1000 + 1, uint64(i)*1000 + 2})
		if len(got) != 1 || got["http://w1:1"] != 1 {
			t.Fatalf("path %d: %v, want only w1 on one block", i, got)
		}
	}
}
