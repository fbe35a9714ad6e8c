package enginetest

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
)

// Two engines that number the same workers in opposite orders render the
// same entries once each has placed the same prompt on the same worker.
func TestEntriesNameHoldersByURL(t *testing.T) {
	const bc = 16
	text := strings.Repeat("a shared prefix ", 8)
	hashes := index.Hash(nil, "m", []byte(text), bc)
	render := func(order ...string) map[uint64]Entry {
		e := engine.New(engine.Policy{Threshold: 0.5, BalanceAbsThreshold: 2, BalanceRelThreshold: 1.5, BlockChars: bc},
			index.New(index.Options{MaxEntries: 1000}), rand.New(rand.NewPCG(1, 2)))
		var specs []engine.WorkerSpec
		for _, u := range order {
			specs = append(specs, engine.WorkerSpec{URL: u})
		}
		e.SetWorkers(specs)
		// Only "http://b" may take it, so both engines place it there.
		if _, err := e.Choose(engine.Request{Hashes: hashes, KeyLen: len(text), Exclude: []string{"http://a"}}, 5); err != nil {
			t.Fatal(err)
		}
		return Entries(e)
	}
	x, y := render("http://a", "http://b"), render("http://b", "http://a")
	if len(x) != len(hashes) || len(y) != len(x) {
		t.Fatalf("entries %d and %d, want %d each", len(x), len(y), len(hashes))
	}
	for h, ex := range x {
		ey := y[h]
		if len(ex.Holders) != 1 || ex.Holders[0].URL != "http://b" || len(ey.Holders) != 1 || ey.Holders[0] != ex.Holders[0] {
			t.Fatalf("entry %x: %+v and %+v, want one holder http://b in both", h, ex, ey)
		}
	}
}
