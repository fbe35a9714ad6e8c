package engine

import (
	"math/rand/v2"
	"testing"

	"github.com/cartrouter/cart/controlplane/index"
)

// A decision matches and records at most MaxRouteBlocks blocks: the rest
// of a huge prompt costs nothing under the routing lock.
func TestRouteCapsBlocks(t *testing.T) {
	idx := index.New(index.Options{MaxEntries: 1 << 20})
	e := New(testPolicy(), idx, rand.New(rand.NewPCG(1, 2)))
	e.SetWorkers(urls("a", "b"))
	hashes := make([]uint64, 3*MaxRouteBlocks)
	for i := range hashes {
		hashes[i] = uint64(i)*0x9e3779b97f4a7c15 + 1
	}
	d, err := e.Choose(Request{Hashes: hashes, KeyLen: len(hashes) * testBC}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if idx.Len() != MaxRouteBlocks || len(d.Placed) != MaxRouteBlocks {
		t.Fatalf("index holds %d entries, decision placed %d; want %d", idx.Len(), len(d.Placed), MaxRouteBlocks)
	}
	e.Release(d.Worker)
	// The prefix still matches: a request sharing the first blocks hits.
	again, _ := e.Choose(Request{Hashes: hashes[:MaxRouteBlocks+10], KeyLen: (MaxRouteBlocks + 10) * testBC}, 2)
	if again.Worker != d.Worker || again.Reason != ReasonCacheHit {
		t.Fatalf("shared prefix went to %s (%s), want a hit on %s", again.Worker, again.Reason, d.Worker)
	}
}
