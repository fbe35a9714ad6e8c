package kvtruth

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/kvevents"
)

// The set against a model (a slice in store order) under random adds,
// removes and clears: same members in the same order, the oldest dropped
// first, and never more nodes than the cap and one.
func TestBlockSetKeepsTheNewest(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		maxN := 1 + rng.IntN(50)
		s := newBlockSet(maxN)
		var model []uint64
		for range 5000 {
			h := rng.Uint64N(80)
			switch op := rng.IntN(20); {
			case op < 12:
				wantDrop := 0
				if !slices.Contains(model, h) {
					model = append(model, h)
					for len(model) > maxN {
						model = model[1:]
						wantDrop++
					}
				}
				if _, got := s.add(h); got != wantDrop {
					t.Fatalf("seed %d: add(%d) dropped %d, want %d", seed, h, got, wantDrop)
				}
			case op < 19:
				i := slices.Index(model, h)
				if i >= 0 {
					model = slices.Delete(model, i, i+1)
				}
				if got := s.remove(h); got != (i >= 0) {
					t.Fatalf("seed %d: remove(%d) = %v", seed, h, got)
				}
			default:
				s.clear()
				model = model[:0]
			}
			if s.len() != len(model) {
				t.Fatalf("seed %d: %d members, want %d", seed, s.len(), len(model))
			}
			for _, m := range model {
				if !s.has(m) {
					t.Fatalf("seed %d: %d missing", seed, m)
				}
			}
			if len(s.nodes) > maxN+1 {
				t.Fatalf("seed %d: %d nodes for a cap of %d", seed, len(s.nodes), maxN)
			}
			// The list runs oldest to newest, as the model does.
			var order []uint64
			for i := s.head; i != none; i = s.nodes[i].next {
				order = append(order, s.nodes[i].hash)
			}
			if !slices.Equal(order, model) {
				t.Fatalf("seed %d: order %v, want %v", seed, order, model)
			}
		}
	}
}

// A flood past the cap keeps the view at the cap and counts what it drops.
func TestStoredFloodIsCapped(t *testing.T) {
	f := &fakeApplier{}
	tr, err := newTracker(Options{Applier: f, BlockChars: testBlockChars, MaxHashesPerRank: 1000})
	if err != nil {
		t.Fatal(err)
	}
	s := tr.sink("w", 0)
	for i := range uint64(10) {
		s.Batch(storedBatch(16, seq(i*500, 500)...), true)
	}
	if r := f.last(); !r.Synced || r.OccupiedTokens != 1000*16 {
		t.Fatalf("after 5000 stored with a cap of 1000: %+v", r)
	}
	wantMetric(t, "dropped hashes", tr.o.Metrics.dropped.WithLabelValues("w"), 4000)
}

func seq(from, n uint64) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = from + uint64(i)
	}
	return out
}

type nopApplier struct{}

func (nopApplier) ClearHoldings(string)                  {}
func (nopApplier) ApplyKVReport(string, engine.KVReport) {}

// BenchmarkStoredFlood: the heap a flood of forged BlockStored hashes (in
// batches of 1000) leaves held by one rank's view.
func BenchmarkStoredFlood(b *testing.B) {
	for _, n := range []int{3_000_000, 10_000_000} {
		b.Run(fmt.Sprintf("hashes=%d", n), func(b *testing.B) {
			for range b.N {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				tr, err := newTracker(Options{Applier: nopApplier{}, BlockChars: testBlockChars})
				if err != nil {
					b.Fatal(err)
				}
				s := tr.sink("w", 0)
				hashes := make([]uint64, 1000)
				for i := 0; i < n; i += len(hashes) {
					for j := range hashes {
						hashes[j] = uint64(i+j)*0x9E3779B97F4A7C15 + 1
					}
					s.Batch(kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: hashes, BlockSize: 16}}}, true)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "heap-MiB")
				runtime.KeepAlive(tr)
			}
		})
	}
}
