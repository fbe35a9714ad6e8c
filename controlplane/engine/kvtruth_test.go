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

// Stores the engine reports beyond CART's own placements age CART's model:
// a worker flushed by traffic CART never saw loses its holdings in CART's
// view, oldest first, although no event names one of them (the engine's
// hashes are not CART's).
func TestForeignStoresAgeTheModel(t *testing.T) {
	pol := testPolicy()
	pol.CapacityBlocks = 12 // modelled from the start (no seed to wait for)
	e := newTestEngine(t, pol, urls("a")...)
	e.ApplyKVReport("a", KVReport{Synced: true, CapacityBlocks: 12, OccupiedBlocks: 0}, nil)
	p := []string{textOf(4*testBC, 1), textOf(4*testBC, 2), textOf(4*testBC, 3)}
	for _, s := range p {
		place(t, e, "a", s)
	}
	// The engine stored what CART placed: nothing foreign, no trim.
	if got := e.ApplyKVReport("a", KVReport{Synced: true, CapacityBlocks: 12, OccupiedBlocks: 12, StoredBlocks: 12}, nil); len(got) != 0 {
		t.Fatalf("trim after CART's own stores: %v", got)
	}
	// Then 6 blocks CART did not place: of the engine's 12, 6 are its
	// latest foreign ones, so 6 of CART's holdings are gone: the oldest.
	trim := e.ApplyKVReport("a", KVReport{Synced: true, CapacityBlocks: 12, OccupiedBlocks: 12, StoredBlocks: 6}, nil)
	e.RemoveHoldings("a", trim)
	if len(trim) != 6 || holds(t, e, "a", p[0]) != 0 || holds(t, e, "a", p[1]) != 2 || holds(t, e, "a", p[2]) != 4 {
		t.Fatalf("trim %d; holds %d %d %d", len(trim), holds(t, e, "a", p[0]), holds(t, e, "a", p[1]), holds(t, e, "a", p[2]))
	}
	// A cache's worth of foreign stores leaves nothing of CART's.
	trim = e.ApplyKVReport("a", KVReport{Synced: true, CapacityBlocks: 12, OccupiedBlocks: 12, StoredBlocks: 12}, nil)
	e.RemoveHoldings("a", trim)
	if holds(t, e, "a", p[2]) != 0 {
		t.Fatal("holdings survive a full cache of foreign stores")
	}
	// CART's new placements are again its own, and push the foreign
	// stores out of the window as the engine stores them.
	place(t, e, "a", p[0])
	if got := e.ApplyKVReport("a", KVReport{Synced: true, CapacityBlocks: 12, OccupiedBlocks: 12, StoredBlocks: 4}, nil); len(got) != 0 {
		t.Fatalf("trim of a fresh placement: %v", got)
	}
	if w := workerOf(t, e, "a"); w.kv.stores.foreign != 8 || w.kv.stores.total != 12 {
		t.Fatalf("ledger %+v", w.kv.stores)
	}
}

func TestStoreLedger(t *testing.T) {
	var l storeLedger
	l.placed = 5
	l.record(3, 10) // 3 of CART's 5 stored, 2 still owed
	if l.foreign != 0 || l.owed != 2 || l.total != 3 {
		t.Fatalf("%+v", l)
	}
	l.record(6, 10) // 2 owed, 4 foreign
	if l.foreign != 4 || l.owed != 0 || l.total != 9 {
		t.Fatalf("%+v", l)
	}
	l.record(7, 10) // 7 foreign; the window keeps the latest 10, of which
	// the 3 before are CART's 3 and 4 foreign, trimmed in proportion
	if l.total != 10 || l.foreign < 9 {
		t.Fatalf("%+v", l)
	}
	l.placed = 50
	l.record(0, 10) // never stored: owed at most a cache's worth
	if l.owed != 10 {
		t.Fatalf("%+v", l)
	}
	for i := range 2000 { // alternating runs stay bounded
		l.placed = i % 2
		l.record(1, 1000)
	}
	if len(l.buckets) > 2*ledgerBuckets || l.total != 1000 || l.foreign < 450 || l.foreign > 550 {
		t.Fatalf("buckets %d, total %d, foreign %d", len(l.buckets), l.total, l.foreign)
	}
	l.record(5, 0) // capacity unknown: nothing kept
	if l.total != 0 || len(l.buckets) != 0 {
		t.Fatalf("%+v", l)
	}
}

// Among equally loaded event-fed workers, a new prefix goes to the engine
// with the most room: one that restarted or was cleared, rather than one
// chosen at random whose cache is full.
func TestNewPrefixesFillTheEngineWithRoom(t *testing.T) {
	e := newTestEngine(t, testPolicy(), urls("a", "b", "c")...)
	for _, w := range []string{"a", "b", "c"} {
		e.ApplyKVReport(w, KVReport{Synced: true, CapacityBlocks: 1000, OccupiedBlocks: 1000}, nil)
	}
	e.ClearHoldings("b")
	e.ApplyKVReport("b", KVReport{Synced: true, CapacityBlocks: 1000, OccupiedBlocks: 0}, nil)
	for i := range 20 {
		d, err := e.Choose(req(textOf(4*testBC, byte(i))), 1)
		if err != nil {
			t.Fatal(err)
		}
		e.Release(d.Worker)
		if d.Worker != "b" {
			t.Fatalf("prefix %d went to %s, not to the emptied engine", i, d.Worker)
		}
	}
}
