package state

import (
	"testing"

	"github.com/cartrouter/cart/controlplane/index"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// A follower applies replicated placements through the worker's capacity
// model, as the leader's Route does: once a worker's modelled cache is
// full, its oldest holdings are forgotten on every node, so a follower
// that becomes leader does not route to prefixes the replica evicted.
func TestFollowerPlacementsFollowTheCapacityModel(t *testing.T) {
	st, eng := newTestState()
	a := &testApplier{t: t, st: st}
	// 64 tokens at 4 characters each in 64-character blocks: 4 blocks.
	a.apply(&cartv1.RaftCommand{Body: &cartv1.RaftCommand_SetWorkers{SetWorkers: &cartv1.SetWorkersCommand{
		Workers: []*cartv1.WorkerSpec{{Url: "http://a", CacheCapacityTokens: 64}, {Url: "http://b"}}}}})
	path := func(seed uint64) []uint64 { return []uint64{seed, seed + 1, seed + 2, seed + 3} }
	for i, seed := range []uint64{100, 200, 300} {
		a.apply(placeBatch(&cartv1.Placement{Worker: "http://a", BlockHashes: path(seed), AtUnixNanos: int64(i + 1)}))
	}
	holds := func(seed uint64) int {
		var n int
		locked(st, func() {
			var m index.Match
			eng.Index().Lookup(path(seed), &m)
			id, _ := eng.WorkerIDOf("http://a")
			n = m.BlocksFor(index.WorkerID(id))
		})
		return n
	}
	if got := holds(300); got != 4 {
		t.Fatalf("the newest placement holds %d blocks, want 4", got)
	}
	if old := holds(100) + holds(200); old != 0 {
		t.Fatalf("a follower kept %d blocks beyond the worker's 4-block model", old)
	}
}
