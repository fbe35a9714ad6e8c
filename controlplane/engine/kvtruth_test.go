package engine

import (
	"slices"
	"testing"
)

func TestClearHoldingsDropsEveryHoldingOfTheWorker(t *testing.T) {
	e := newTestEngine(t, testPolicy(), urls("a", "b")...)
	p1, p2 := textOf(4*testBC, 1), textOf(4*testBC, 2)
	place(t, e, "a", p1)
	place(t, e, "a", p2)
	place(t, e, "b", p1)
	if !e.ClearHoldings("a") {
		t.Fatal("known worker not cleared")
	}
	if holds(t, e, "a", p1) != 0 || holds(t, e, "a", p2) != 0 {
		t.Fatal("a still holds a prefix after its cache was cleared")
	}
	if holds(t, e, "b", p1) != 4 {
		t.Fatal("b lost its holding with a's clear")
	}
	// The old holdings go in purge steps: p2, held by a only, leaves the
	// index; p1 stays with b.
	purge(t, e)
	if n := e.idx.Len(); n != 4 {
		t.Fatalf("index holds %d entries after the purge, want p1's 4", n)
	}
	// The cleared worker is a worker like any other afterwards.
	place(t, e, "a", p2)
	if holds(t, e, "a", p2) != 4 {
		t.Fatal("a placed after its clear does not hold the prefix")
	}
	if e.ClearHoldings("nobody") {
		t.Fatal("unknown worker reported cleared")
	}
}

// The engine's reported capacity replaces the declared one (both ways),
// and after an eviction the oldest holdings beyond the engine's occupancy
// are returned for removal.
func TestKVReportDrivesTheModel(t *testing.T) {
	pol := testPolicy()
	pol.CapacityBlocks = 4 // a declared guess, too small
	e := newTestEngine(t, pol, urls("a")...)
	if got := e.ApplyKVReport("a", KVReport{Synced: true, OccupiedBlocks: 0}, nil); len(got) != 0 {
		t.Fatalf("trim without eviction: %v", got)
	}
	// The engine never evicted: nothing is forgotten, whatever was declared.
	p := []string{textOf(4*testBC, 1), textOf(4*testBC, 2), textOf(4*testBC, 3)}
	for _, s := range p {
		place(t, e, "a", s)
	}
	if holds(t, e, "a", p[0]) != 4 {
		t.Fatal("the declared capacity evicted although the engine reports no eviction")
	}
	// The engine is full at 8 blocks: the model follows, oldest out.
	if got := e.ApplyKVReport("a", KVReport{Synced: true, OccupiedBlocks: 8, CapacityBlocks: 8}, nil); len(got) != 0 {
		t.Fatalf("trim without eviction: %v", got)
	}
	if holds(t, e, "a", p[0]) != 0 || holds(t, e, "a", p[1]) != 4 {
		t.Fatal("the model did not shrink to the reported capacity")
	}
	if st := e.KV("a"); !st.On || st.CapacityBlocks != 8 || st.OccupiedBlocks != 8 {
		t.Fatalf("KV state %+v", st)
	}
	// The engine evicted down to 6 blocks: the 2 oldest holdings go, the
	// deepest blocks of the oldest prefix first (its leading blocks are
	// as recent as anything sent after them).
	trim := e.ApplyKVReport("a", KVReport{Synced: true, OccupiedBlocks: 6, CapacityBlocks: 8, Evicted: true}, nil)
	if len(trim) != 2 {
		t.Fatalf("trim %d blocks, want 2", len(trim))
	}
	e.RemoveHoldings("a", trim)
	if holds(t, e, "a", p[1]) != 2 || holds(t, e, "a", p[2]) != 4 {
		t.Fatalf("after the trim: p1 %d p2 %d", holds(t, e, "a", p[1]), holds(t, e, "a", p[2]))
	}
	// Degraded: back to the declared capacity.
	e.ApplyKVReport("a", KVReport{Synced: false}, nil)
	if a := e.Workers()[0].Accuracy; a.ModelCapacity != 4 || e.KV("a").On {
		t.Fatalf("degraded model %+v, kv %+v", a, e.KV("a"))
	}
	if got := e.ApplyKVReport("nobody", KVReport{Synced: true, Evicted: true}, []uint64{7}); !slices.Equal(got, []uint64{7}) {
		t.Fatalf("unknown worker: %v", got)
	}
}

// While events flow, the closed loop does not resize the model: the
// engine's report is the truth it would only guess.
func TestKVReportOverridesClosedLoop(t *testing.T) {
	pol := testPolicy()
	pol.ClosedLoop = true
	e := newTestEngine(t, pol, urls("a")...)
	e.ApplyKVReport("a", KVReport{Synced: true, OccupiedBlocks: 100, CapacityBlocks: 100}, nil)
	place(t, e, "a", textOf(8*testBC, 1))
	e.Feedback("a", 80, 80, 3e9, 20, 0) // a far miss, settled
	if a := e.Workers()[0].Accuracy; a.ModelCapacity != 100 || a.Misses != 0 {
		t.Fatalf("closed loop acted on an event-fed worker: %+v", a)
	}
}

// A worker nobody modelled before its first report starts from what the
// index holds for it (in seed steps), oldest first out.
func TestKVReportSeedsTheModelFromTheIndex(t *testing.T) {
	e := newTestEngine(t, testPolicy(), urls("a")...)
	old, recent := textOf(4*testBC, 1), textOf(4*testBC, 2)
	place(t, e, "a", old)
	place(t, e, "a", recent)
	e.ApplyKVReport("a", KVReport{Synced: true, OccupiedBlocks: 4, CapacityBlocks: 4}, nil)
	seedSteps(t, e, 3, nil)
	if holds(t, e, "a", old) != 0 || holds(t, e, "a", recent) != 4 {
		t.Fatalf("old %d recent %d, want 0 and 4", holds(t, e, "a", old), holds(t, e, "a", recent))
	}
}

// The daily reset empties the index and the models that follow it, with
// no release reported per entry; routing goes on from empty.
func TestClearIndexEmptiesIndexAndModels(t *testing.T) {
	pol := testPolicy()
	pol.CapacityBlocks = 100
	e := newTestEngine(t, pol, urls("a", "b")...)
	p1, p2 := textOf(4*testBC, 1), textOf(4*testBC, 2)
	place(t, e, "a", p1)
	place(t, e, "b", p2)
	e.ClearIndex(nil)
	if n := e.idx.Len(); n != 0 {
		t.Fatalf("index holds %d entries after the reset", n)
	}
	for _, w := range e.workers {
		if w.model == nil || w.model.len() != 0 || w.model.capacity != 100 {
			t.Fatalf("worker %s: model %+v after the reset, want empty with capacity 100", w.spec.URL, w.model)
		}
	}
	place(t, e, "a", p1)
	if holds(t, e, "a", p1) != 4 || workerOf(t, e, "a").model.len() != 4 {
		t.Fatal("placing after the reset did not record the prefix in index and model")
	}
}

func workerOf(t *testing.T, e *Engine, url string) *worker {
	t.Helper()
	wk, ok := e.byURL[url]
	if !ok {
		t.Fatalf("no worker %s", url)
	}
	return wk
}
