package decider

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
)

// SeedModels runs the seeds started by first KV reports to their end in
// several timed lock holds, shared by concurrent callers, with routing
// going on: each worker's model ends holding exactly what the index
// records for it.
func TestSeedModelsFillsTheModelsInSteps(t *testing.T) {
	now := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	d := newTestDecider(&now, 100_000, -1)
	for i := range 600 {
		r := req(fmt.Sprintf("%04d: a prompt with some text", i)) // 9 blocks each
		r.Exclude = []string{[]string{"a", "b"}[i%2]}
		dec, err := d.Route(r)
		if err != nil {
			t.Fatal(err)
		}
		_ = d.Settle(dec.Ticket, Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1})
	}
	d.Do(OpKV, func(eng *engine.Engine) {
		eng.ApplyKVReport("a", engine.KVReport{Synced: true}, nil)
		eng.ApplyKVReport("b", engine.KVReport{Synced: true}, nil)
	})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { d.SeedModels(func(string, []uint64) { t.Error("a trim without an eviction") }) })
	}
	wg.Go(func() {
		for i := range 200 {
			dec, err := d.Route(req(fmt.Sprintf("new prompt %04d during the seed", i)))
			if err != nil {
				t.Error(err)
				return
			}
			_ = d.Settle(dec.Ticket, Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1})
		}
	})
	wg.Wait()
	if n := holdCount(t, d, OpSeed); n < 4 {
		t.Fatalf("%d seed lock holds for a walk of more than two steps", n)
	}
	d.Do(OpRead, func(eng *engine.Engine) {
		if eng.Seeding() {
			t.Fatal("a seed is left")
		}
		held := map[index.WorkerID]int{}
		eng.Index().Walk(func(_ uint64, _ int64, hs []index.Holder) bool {
			for _, h := range hs {
				held[h.Worker]++
			}
			return true
		})
		for _, w := range eng.Workers() {
			id, _ := eng.WorkerIDOf(w.URL)
			if w.Accuracy.ModelBlocks == 0 || w.Accuracy.ModelBlocks != held[index.WorkerID(id)] {
				t.Fatalf("%s: model of %d blocks, the index records %d", w.URL, w.Accuracy.ModelBlocks, held[index.WorkerID(id)])
			}
		}
	})
}
