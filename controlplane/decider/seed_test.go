package decider

import (
	"context"
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
		dec, err := d.Decide(r)
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
		wg.Go(func() {
			d.SeedModels(context.Background(), func(string, []uint64) { t.Error("a trim without an eviction") })
		})
	}
	wg.Go(func() {
		for i := range 200 {
			dec, err := d.Decide(req(fmt.Sprintf("new prompt %04d during the seed", i)))
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

// cancelAfter is a context that turns cancelled after its Err was asked
// checks times: SeedModels asks once per step.
type cancelAfter struct {
	context.Context
	checks int
}

func (c *cancelAfter) Err() error {
	if c.checks <= 0 {
		return context.Canceled
	}
	c.checks--
	return nil
}

// A cancelled SeedModels (its leader stepped down) stops between two steps
// and leaves the seed to the next caller, which finishes it.
func TestSeedModelsStopsWithItsContext(t *testing.T) {
	d := New(Options{Policy: engine.Policy{Threshold: 0.5, BalanceAbsThreshold: 4, BalanceRelThreshold: 1.5, BlockChars: 64}, MaxEntries: 1 << 16})
	d.SetWorkers([]engine.WorkerSpec{{URL: "http://a"}})
	d.Do(OpRead, func(e *engine.Engine) {
		for i := range 5000 {
			e.ApplyPlacement("http://a", []uint64{uint64(i) + 1}, int64(i))
		}
		e.ApplyKVReport("http://a", engine.KVReport{Synced: true, CapacityBlocks: 10_000}, nil)
	})
	// Cancelled after two steps: 5,000 entries take more (1,024 a step).
	d.SeedModels(&cancelAfter{Context: context.Background(), checks: 2}, func(string, []uint64) {})
	var seeding bool
	d.Do(OpRead, func(e *engine.Engine) { seeding = e.Seeding() })
	if !seeding {
		t.Fatal("a cancelled SeedModels finished the seed (or none was started)")
	}
	d.SeedModels(context.Background(), func(string, []uint64) {})
	d.Do(OpRead, func(e *engine.Engine) { seeding = e.Seeding() })
	if seeding {
		t.Fatal("the next caller did not finish the seed")
	}
}
