package state

import (
	"maps"
	"testing"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// Versions before withdrawals moved into PlaceBatchCommand.withdrawals
// wrote them as separate, ignorable unplace_batch entries. Nothing
// proposes one any more, but a log written by such a version must replay
// to the same index, so the apply path stays.
func TestOldUnplaceBatchEntriesReplay(t *testing.T) {
	st, eng := newTestState()
	a := &testApplier{t: t, st: st}
	const wa, wb = "http://a:1", "http://b:1"
	hashes := []uint64{11, 12, 13}
	a.apply(setWorkers(wa, wb))
	a.apply(placeBatch(
		&cartv1.Placement{Worker: wa, BlockHashes: hashes, AtUnixNanos: 1},
		&cartv1.Placement{Worker: wb, BlockHashes: hashes[:2], AtUnixNanos: 2},
	))
	if got, want := lookupByURL(st, eng, hashes), map[string]int{wa: 3, wb: 2}; !maps.Equal(got, want) {
		t.Fatalf("after placing: %v, want %v", got, want)
	}
	old := &cartv1.RaftCommand{Ignorable: true, Body: &cartv1.RaftCommand_UnplaceBatch{UnplaceBatch: &cartv1.UnplaceBatchCommand{
		Placements: []*cartv1.Placement{
			{Worker: wa, BlockHashes: hashes, AtUnixNanos: 1},
			{Worker: "http://gone:1", BlockHashes: hashes}, // a worker removed since: skipped
		},
	}}}
	if res := a.apply(old); res.Err != nil {
		t.Fatalf("old unplace_batch entry: %v", res.Err)
	}
	if got, want := lookupByURL(st, eng, hashes), map[string]int{wb: 2}; !maps.Equal(got, want) {
		t.Fatalf("after the old withdrawal: %v, want %v", got, want)
	}
}
