package engine

import (
	"cmp"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/cartrouter/cart/controlplane/index"
)

// refSeed is the one-shot seed the stepped one replaces (resizeFromKV as
// it was): w's model built from one walk of the whole index, most recently
// sent first with the index's LRU order breaking ties, then shrunk to the
// reported capacity.
func refSeed(e *Engine, w *worker) {
	w.model = newBlockLRU(0)
	type held struct {
		hash uint64
		at   int64
	}
	var hs []held
	e.idx.Walk(func(hash uint64, _ int64, holders []index.Holder) bool {
		for _, h := range holders {
			if h.Worker == w.id {
				hs = append(hs, held{hash, h.At})
				break
			}
		}
		return true
	})
	slices.SortStableFunc(hs, func(x, y held) int { return cmp.Compare(y.at, x.at) })
	hashes := make([]uint64, len(hs))
	for i, h := range hs {
		hashes[i] = h.hash
	}
	w.model.touch(hashes, nil)
	w.model.capacity = w.kv.capacity
	e.forget(w, w.model.shrink(nil))
}

// refReport applies r the way ApplyKVReport did with the one-shot seed.
func refReport(e *Engine, url string, r KVReport) []uint64 {
	w := e.byURL[url]
	fresh := w.model == nil
	e.ApplyKVReport(url, KVReport{Synced: true, OccupiedBlocks: r.OccupiedBlocks, CapacityBlocks: r.CapacityBlocks}, nil)
	if fresh {
		w.seed, w.model = nil, nil
		refSeed(e, w)
	}
	if r.Evicted {
		return e.kvTrim(w, nil)
	}
	return nil
}

// seedSteps drives e's seeds to their end in steps of limit, sorting
// in between as the decider does outside its lock, calling between before
// each step; it returns the trims the seeds deferred and the steps taken.
func seedSteps(t testing.TB, e *Engine, limit int, between func(step int)) (trims []SeedTrim, steps int) {
	t.Helper()
	for ; ; steps++ {
		if steps > 1_000_000 {
			t.Fatal("the seed does not end")
		}
		if between != nil {
			between(steps)
		}
		r := e.SeedStep(limit)
		trims = append(trims, r.Trims...)
		for _, j := range r.Sorts {
			j.Sort()
		}
		if len(r.Sorts) > 0 {
			e.SeedSorted(r.Sorts)
			continue
		}
		if !r.More {
			return trims, steps
		}
	}
}

// modelOrder lists w's model from most to least recent, checking its
// links and that it holds nothing twice.
func modelOrder(t testing.TB, e *Engine, url string) []uint64 {
	t.Helper()
	m := e.byURL[url].model
	if m == nil {
		return nil
	}
	var out []uint64
	seen := map[uint64]bool{}
	for n, prev := m.head, int32(-1); n >= 0; prev, n = n, m.node(n).next {
		if m.node(n).prev != prev {
			t.Fatalf("%s: model links broken at %d", url, n)
		}
		h := m.node(n).hash
		if seen[h] {
			t.Fatalf("%s: model holds %x twice", url, h)
		}
		seen[h] = true
		out = append(out, h)
	}
	if len(out) != m.len() || (len(out) > 0 && out[len(out)-1] != m.node(m.tail).hash) {
		t.Fatalf("%s: model lists %d blocks, maps %d", url, len(out), m.len())
	}
	return out
}

// seedEngine is an engine over workers a, b, c with a few thousand
// placements: shared prefixes (several holders per entry), equal times
// (ties the LRU order breaks) and re-placements. With seed, every
// placement is at a distinct time.
func seedEngine(t testing.TB, seed uint64) *Engine {
	e := newTestEngine(t, testPolicy(), urls("a", "b", "c")...)
	r := rand.New(rand.NewPCG(seed, 7))
	roots := make([]uint64, 20)
	for i := range roots {
		roots[i] = r.Uint64()
	}
	for i := range 1500 {
		p := []uint64{roots[r.IntN(len(roots))]}
		for range r.IntN(8) {
			p = append(p, r.Uint64())
		}
		e.ApplyPlacement([]string{"a", "b", "c"}[r.IntN(3)], p, int64(i/4))
	}
	return e
}

// On a quiet index the stepped seed gives exactly the one-shot seed's
// model, order included, and the same index, whatever the step size and
// capacity (a capacity below the holdings forgets the oldest).
func TestSeedEqualsOneShotSeedOnAQuietIndex(t *testing.T) {
	for _, limit := range []int{1, 7, 2048} {
		for _, capacity := range []int{0, 300} {
			want, got := seedEngine(t, 1), seedEngine(t, 1)
			rep := KVReport{Synced: true, OccupiedBlocks: capacity, CapacityBlocks: capacity}
			refReport(want, "a", rep)
			refReport(want, "b", rep)
			got.ApplyKVReport("a", rep, nil)
			got.ApplyKVReport("b", rep, nil)
			if got.byURL["a"].model.len() != 0 {
				t.Fatal("the first report filled the model in its own lock hold")
			}
			_, steps := seedSteps(t, got, limit, nil)
			for _, url := range []string{"a", "b"} {
				w, g := modelOrder(t, want, url), modelOrder(t, got, url)
				if len(w) == 0 || !slices.Equal(w, g) {
					t.Fatalf("limit %d capacity %d: %s's model has %d blocks, want the one-shot seed's %d in its order", limit, capacity, url, len(g), len(w))
				}
			}
			if !slices.Equal(snapshot(want), snapshot(got)) {
				t.Fatalf("limit %d capacity %d: the index differs from the one-shot seed's", limit, capacity)
			}
			if got.byURL["c"].model != nil || got.Seeding() {
				t.Fatal("a worker without a report got a model, or a seed is left")
			}
			if limit == 1 && steps < 1000 {
				t.Fatalf("%d steps of one entry for thousands of entries", steps)
			}
		}
	}
}

// Placements, withdrawals and evictions between steps: the model ends
// holding every holding the index records for the worker, nothing else,
// nothing twice; what was placed during the seed is at the front, newest
// first, ahead of everything seeded.
func TestSeedWithPlacementsBetweenSteps(t *testing.T) {
	e := seedEngine(t, 2)
	r := rand.New(rand.NewPCG(3, 4))
	e.ApplyKVReport("a", KVReport{Synced: true, OccupiedBlocks: 10}, nil)
	var placed [][]uint64 // a's placements during the seed, in order
	var withdrawn []uint64
	seedSteps(t, e, 16, func(step int) {
		p := []uint64{r.Uint64(), r.Uint64()}
		switch step % 3 {
		case 0:
			e.ApplyPlacement("a", p, int64(10_000+step))
			placed = append(placed, p)
		case 1:
			e.ApplyPlacement("b", p, int64(10_000+step))
		case 2:
			// An old holding of a's withdrawn (an engine-reported
			// eviction on another path).
			if hs := snapshotHoldings(e, "a"); len(hs) > 0 {
				oldest := hs[len(hs)-1]
				e.RemoveHoldings("a", []uint64{oldest})
				withdrawn = append(withdrawn, oldest)
			}
		}
	})
	if len(placed) < 10 || len(withdrawn) < 10 {
		t.Fatalf("only %d placements and %d withdrawals during the seed", len(placed), len(withdrawn))
	}
	order := modelOrder(t, e, "a")
	var front []uint64
	for i := len(placed) - 1; i >= 0; i-- {
		front = append(front, placed[i]...)
	}
	if !slices.Equal(order[:len(front)], front) {
		t.Fatal("the placements made during the seed are not at the front, newest first")
	}
	held := snapshotHoldings(e, "a")
	if !sameSet(order, held) {
		t.Fatalf("model holds %d blocks, the index records %d for a", len(order), len(held))
	}
	for _, h := range withdrawn {
		if slices.Contains(order, h) {
			t.Fatal("a block withdrawn during the seed is in the model")
		}
	}
}

// snapshotHoldings lists what the index records for url.
func snapshotHoldings(e *Engine, url string) []uint64 {
	id := e.byURL[url].id
	var out []uint64
	e.idx.Walk(func(h uint64, _ int64, hs []index.Holder) bool {
		for _, x := range hs {
			if x.Worker == id {
				out = append(out, h)
			}
		}
		return true
	})
	return out
}

func sameSet(a, b []uint64) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// stepUntil runs seed steps (sorting as the decider does) until cond.
func stepUntil(t *testing.T, e *Engine, limit int, cond func(SeedResult) bool) {
	t.Helper()
	for range 100_000 {
		r := e.SeedStep(limit)
		if cond(r) {
			return
		}
		for _, j := range r.Sorts {
			j.Sort()
		}
		e.SeedSorted(r.Sorts)
	}
	t.Fatal("condition never met")
}

// A worker removed during its seed takes the seed with it; re-added, it
// has a new id and a fresh seed, with none of the old id's holdings.
func TestSeedAbandonedWhenTheWorkerIsRemovedOrReAdded(t *testing.T) {
	for _, phase := range []seedPhase{seedWalking, seedAdding} {
		e := seedEngine(t, 5)
		e.ApplyKVReport("a", KVReport{Synced: true}, nil)
		stepUntil(t, e, 8, func(SeedResult) bool { s := e.byURL["a"].seed; return s != nil && s.phase == phase })
		e.SetWorkers(urls("b", "c"))
		if e.Seeding() {
			t.Fatalf("phase %d: a removed worker's seed goes on", phase)
		}
		e.SetWorkers(urls("a", "b", "c"))
		if e.byURL["a"].model != nil {
			t.Fatal("the re-added worker has a model before any report")
		}
		e.ApplyPlacement("a", []uint64{1, 2}, 99_999)
		e.ApplyKVReport("a", KVReport{Synced: true}, nil)
		seedSteps(t, e, 8, nil)
		if got := modelOrder(t, e, "a"); !slices.Equal(got, []uint64{1, 2}) {
			t.Fatalf("phase %d: the re-added worker's model is %d blocks, want its 2 new ones", phase, len(got))
		}
	}
}

// A cleared cache (a new index id, the old holdings retired) and the
// daily reset during the seed: the model starts over (after the reset,
// from the next report) and nothing collected before lands in it.
func TestSeedAbandonedOnClearHoldingsAndDailyReset(t *testing.T) {
	for name, clearIt := range map[string]func(e *Engine){
		"clear-holdings": func(e *Engine) { e.ClearHoldings("a") },
		"daily-reset":    func(e *Engine) { e.ClearIndex(nil) },
	} {
		for _, phase := range []seedPhase{seedWalking, seedSorting, seedAdding} {
			e := seedEngine(t, 6)
			e.ApplyKVReport("a", KVReport{Synced: true}, nil)
			var sorts []*SeedSort
			stepUntil(t, e, 8, func(r SeedResult) bool {
				if phase == seedSorting && len(r.Sorts) > 0 {
					sorts = r.Sorts
					return true
				}
				s := e.byURL["a"].seed
				return s != nil && s.phase == phase
			})
			clearIt(e)
			for _, j := range sorts {
				j.Sort()
			}
			e.SeedSorted(sorts) // from a sorter that was outside the lock
			e.ApplyPlacement("a", []uint64{1, 2}, 99_999)
			// The engine's next report (after a daily reset it seeds a
			// new model from the emptied index).
			e.ApplyKVReport("a", KVReport{Synced: true}, nil)
			seedSteps(t, e, 8, nil)
			if got := modelOrder(t, e, "a"); !slices.Equal(got, []uint64{1, 2}) {
				t.Fatalf("%s in phase %d: model holds %d blocks, want the 2 placed after", name, phase, len(got))
			}
			if e.byURL["a"].seed != nil {
				t.Fatalf("%s in phase %d: the seed is still there", name, phase)
			}
		}
	}
}

// A feed going unsynced mid-seed drops the model (no capacity is
// declared): the seed is abandoned. Synced again, one fresh seed gives
// the one-shot result.
func TestSeedAbandonedWhenTheFeedGoesUnsynced(t *testing.T) {
	e, want := seedEngine(t, 8), seedEngine(t, 8)
	e.ApplyKVReport("a", KVReport{Synced: true}, nil)
	stepUntil(t, e, 8, func(SeedResult) bool { s := e.byURL["a"].seed; return s != nil && s.phase == seedAdding })
	e.ApplyKVReport("a", KVReport{Synced: false}, nil)
	if e.byURL["a"].model != nil || e.Seeding() {
		t.Fatal("an unsynced worker kept its model or its seed")
	}
	e.ApplyKVReport("a", KVReport{Synced: true}, nil)
	seedSteps(t, e, 8, nil)
	refReport(want, "a", KVReport{Synced: true})
	if !slices.Equal(modelOrder(t, e, "a"), modelOrder(t, want, "a")) {
		t.Fatal("the seed after resync differs from the one-shot seed")
	}
}

// A second report during the seed starts no second walk and only
// resizes; an Evicted report's trim waits for the end of the seed (the
// model's tail is not the oldest holding until then) and is then sized by
// the latest occupancy, as the one-shot seed followed by that report
// would give.
func TestSecondAndEvictedReportsDuringTheSeed(t *testing.T) {
	e, want := seedEngine(t, 9), seedEngine(t, 9)
	e.ApplyKVReport("a", KVReport{Synced: true}, nil)
	s := e.byURL["a"].seed
	stepUntil(t, e, 8, func(SeedResult) bool { return s.phase == seedWalking && len(s.walked) > 0 })
	e.ApplyKVReport("a", KVReport{Synced: true, OccupiedBlocks: 500, CapacityBlocks: 600}, nil)
	if e.byURL["a"].seed != s || len(e.seeds.by) == 0 || s.phase != seedWalking {
		t.Fatal("a second report replaced the seed or restarted the walk")
	}
	if trim := e.ApplyKVReport("a", KVReport{Synced: true, OccupiedBlocks: 400, CapacityBlocks: 600, Evicted: true}, nil); len(trim) != 0 {
		t.Fatalf("an eviction trimmed %d blocks of an incomplete model", len(trim))
	}
	trims, _ := seedSteps(t, e, 8, nil)
	refReport(want, "a", KVReport{Synced: true, OccupiedBlocks: 500, CapacityBlocks: 600})
	wantTrim := refReport(want, "a", KVReport{Synced: true, OccupiedBlocks: 400, CapacityBlocks: 600, Evicted: true})
	if len(wantTrim) == 0 || len(trims) != 1 || trims[0].URL != "a" || !slices.Equal(trims[0].Hashes, wantTrim) {
		t.Fatalf("deferred trims %v, want one of a's %d oldest", trims, len(wantTrim))
	}
	if !slices.Equal(modelOrder(t, e, "a"), modelOrder(t, want, "a")) {
		t.Fatal("the model differs from the one-shot seed's")
	}
	// After the seed, evictions trim at once again.
	if trim := e.ApplyKVReport("a", KVReport{Synced: true, OccupiedBlocks: 300, CapacityBlocks: 600, Evicted: true}, nil); len(trim) != 600-300 {
		t.Fatalf("trim of %d after the seed, want %d", len(trim), 600-300)
	}
}

// installIndex empties e's index with clear and puts from's entries back
// into it, as a snapshot's install does.
func installIndex(e, from *Engine, clear func()) {
	type rec struct {
		h    uint64
		used int64
		hs   []index.Holder
	}
	var recs []rec
	from.idx.Walk(func(h uint64, used int64, hs []index.Holder) bool {
		recs = append(recs, rec{h, used, slices.Clone(hs)})
		return true
	})
	clear()
	for _, r := range recs {
		e.idx.PutBack(r.h, r.used, r.hs)
	}
}

// A snapshot installed during a seed (ClearIndex, then the entries put
// back, as state.Restore does) drops the seed and the model; the worker's
// next KV report seeds a new one from the restored index.
func TestSeedAfterASnapshotInstall(t *testing.T) {
	e, want := seedEngine(t, 10), seedEngine(t, 10)
	e.ApplyKVReport("a", KVReport{Synced: true}, nil)
	stepUntil(t, e, 8, func(SeedResult) bool { s := e.byURL["a"].seed; return s.phase == seedWalking && len(s.walked) > 0 })
	installIndex(e, want, func() { e.ClearIndex(index.Reserve(want.idx.Len())) })
	seedSteps(t, e, 8, nil)
	if w := e.byURL["a"]; w.model != nil || w.seed != nil {
		t.Fatal("a model over the replaced index survived the install")
	}
	e.ApplyKVReport("a", KVReport{Synced: true}, nil)
	seedSteps(t, e, 8, nil)
	refReport(want, "a", KVReport{Synced: true})
	if g, w := modelOrder(t, e, "a"), modelOrder(t, want, "a"); len(w) == 0 || !slices.Equal(g, w) {
		t.Fatalf("model of %d blocks after the restore, want the one-shot seed's %d", len(g), len(w))
	}
}

// An index replaced under the walk by a path that keeps the models (Clear,
// then the entries put back) restarts the walk: the seed reflects the new
// index.
func TestSeedWalkRestartsWhenTheIndexIsReplaced(t *testing.T) {
	e, want := seedEngine(t, 10), seedEngine(t, 10)
	e.ApplyKVReport("a", KVReport{Synced: true}, nil)
	stepUntil(t, e, 8, func(SeedResult) bool { s := e.byURL["a"].seed; return s.phase == seedWalking && len(s.walked) > 0 })
	installIndex(e, want, e.idx.Clear)
	seedSteps(t, e, 8, nil)
	refReport(want, "a", KVReport{Synced: true})
	if g, w := modelOrder(t, e, "a"), modelOrder(t, want, "a"); len(w) == 0 || !slices.Equal(g, w) {
		t.Fatalf("model of %d blocks after the restore, want the one-shot seed's %d", len(g), len(w))
	}
}

// Several workers' first reports share one walk.
func TestSeedsShareOneWalk(t *testing.T) {
	e := seedEngine(t, 11)
	for _, u := range []string{"a", "b", "c"} {
		e.ApplyKVReport(u, KVReport{Synced: true}, nil)
	}
	e.SeedStep(1 << 20) // starts the walk
	if len(e.seeds.by) != 3 {
		t.Fatalf("the walk collects for %d workers, want 3", len(e.seeds.by))
	}
	r := e.SeedStep(1 << 20)
	if len(r.Sorts) != 3 {
		t.Fatalf("one walk of the whole index gave %d lists, want 3", len(r.Sorts))
	}
}

// A model that grew past seedLiveMax while its holdings were collected
// keeps its own map (SeedSorted moves only small ones into the map Sort
// sized), with the same result.
func TestSeedWithALargeLiveModel(t *testing.T) {
	e := seedEngine(t, 12)
	e.ApplyKVReport("a", KVReport{Synced: true}, nil)
	e.SeedStep(8) // starts the walk
	var placed []uint64
	for i := range seedLiveMax + 100 {
		p := []uint64{uint64(1e12) + uint64(i)}
		e.ApplyPlacement("a", p, int64(20_000+i))
		placed = append(placed, p[0])
	}
	before := e.byURL["a"].model.byHash
	seedSteps(t, e, 8, nil)
	m := e.byURL["a"].model
	if reflect.ValueOf(before).UnsafePointer() != reflect.ValueOf(m.byHash).UnsafePointer() {
		t.Fatal("the large model's map was replaced: SeedSorted copied it under the lock")
	}
	order := modelOrder(t, e, "a")
	slices.Reverse(placed)
	if !slices.Equal(order[:len(placed)], placed) || !sameSet(order, snapshotHoldings(e, "a")) {
		t.Fatalf("model of %d blocks: placements not at the front or holdings missing", len(order))
	}
}
