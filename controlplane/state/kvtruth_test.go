package state

import (
	"testing"

	"github.com/cartrouter/cart/controlplane/index"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// An engine's reported cache clear reaches every node through the log: the
// worker stops holding anything, the others keep their holdings.
func TestClearHoldingsCommand(t *testing.T) {
	st, eng := newTestState()
	a := &testApplier{t: t, st: st}
	a.apply(setWorkers("http://a", "http://b"))
	hashes := []uint64{1, 2, 3}
	a.apply(placeBatch(&cartv1.Placement{Worker: "http://a", BlockHashes: hashes, AtUnixNanos: 1},
		&cartv1.Placement{Worker: "http://b", BlockHashes: hashes[:2], AtUnixNanos: 1}))
	a.apply(&cartv1.RaftCommand{Ignorable: true, Body: &cartv1.RaftCommand_ClearHoldings{
		ClearHoldings: &cartv1.ClearHoldingsCommand{Workers: []string{"http://a", "http://gone"}}}})
	got := lookupByURL(st, eng, hashes)
	if got["http://a"] != 0 || got["http://b"] != 2 {
		t.Fatalf("holders after the clear: %v", got)
	}
	// Applying the command also purged a's old entries: block 3, held
	// by a only, is gone from the index.
	var left []index.Holder
	locked(st, func() { left = eng.Index().Holders(3) })
	if left != nil {
		t.Fatalf("block 3 still held by %v after the clear was applied", left)
	}
	if st.Applied() != a.i {
		t.Fatalf("applied %d, want %d", st.Applied(), a.i)
	}
}
