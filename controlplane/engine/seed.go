package engine

import (
	"cmp"
	"slices"

	"github.com/cartrouter/cart/controlplane/index"
)

// Seeding the cache model of a worker whose first KV report arrives when
// nobody modelled it (a new control-plane leader, the all-in-one router's
// start). The model has to start from what the index holds for the worker,
// most recently sent first, so that evictions take its oldest holdings;
// collecting that in one pass over the index held the routing lock for
// tens of milliseconds at a million entries. So the model is created empty
// at once and is live from then on (placements touch its front, releases
// leave it), and the older holdings reach it in bounded steps:
//
//  1. one oldest-first walk of the index (index.WalkUpStep), shared by
//     every worker waiting for a seed, collects each one's (hash, time);
//  2. the caller orders each list outside the lock (SeedSort.Sort);
//  3. the holdings go to the model's old end, newest first, in steps,
//     skipping those already modelled (placed again since) and those the
//     index no longer records for the worker, forgetting those beyond the
//     model's capacity, as a one-shot seed followed by a shrink would.
//
// A seed is abandoned when the worker's model or index id changes under
// it (the worker removed, its cache cleared, the daily reset, its feed
// degrading to a mode without a model): its collected holdings are stale.

// seedPhase is where a worker's seed is.
type seedPhase uint8

const (
	seedWaiting seedPhase = iota // for the next index walk
	seedWalking                  // the walk in progress collects for it
	seedSorting                  // its holdings are being ordered outside the lock
	seedAdding                   // its holdings go to the model's old end
)

type seedHold struct {
	hash uint64
	at   int64
}

// modelSeed is one worker's seed in progress.
type modelSeed struct {
	id    index.WorkerID
	model *blockLRU // the model it fills; another one there means abandoned
	phase seedPhase
	// walked is what the walk collected, oldest first, in fixed-size
	// blocks: one slice doubling under the lock would copy megabytes and
	// pay the garbage collector's assist for them in a single step
	// (measured: steps of 20-46 ms at a million entries).
	walked [][]seedHold
	held   []seedHold // sorted, being added
	next   int        // the next of held to add
	// evicted: an Evicted report came while seeding. Its trim waits for
	// the end of the seed (see ApplyKVReport).
	evicted bool
}

// seeder is the engine's side of the seeds in progress.
type seeder struct {
	// by are the seeds an index walk collects for (few: one per worker);
	// a walk is in progress exactly while there are any.
	by []*modelSeed
}

// SeedSort is one worker's collected holdings, ordered by Sort outside the
// routing lock and handed back with SeedSorted.
type SeedSort struct {
	seed   *modelSeed
	walked [][]seedHold
	held   []seedHold
	// Room for the holdings in the model, allocated by Sort: growing the
	// model's map and pages under the lock paid the garbage collector's
	// assists in the steps (holds of 1-2 ms while a cycle ran, 8 seeds of
	// 125k holdings).
	byHash map[uint64]int32
	pages  [][]lruNode
	room   int // the model's capacity when handed out (0: unbounded)
}

// Sort puts the holdings in model order: most recently sent first, ties
// in the index's own LRU order (the walk collected them oldest first).
// It runs outside the lock: ordering and sizing eight workers' 125k
// holdings each took 11-57 ms (BenchmarkSeedStep).
func (j *SeedSort) Sort() {
	n := 0
	for _, b := range j.walked {
		n += len(b)
	}
	j.held = make([]seedHold, 0, n)
	for i := len(j.walked) - 1; i >= 0; i-- {
		b := j.walked[i]
		for k := len(b) - 1; k >= 0; k-- {
			j.held = append(j.held, b[k])
		}
	}
	j.walked = nil
	slices.SortStableFunc(j.held, func(x, y seedHold) int { return cmp.Compare(y.at, x.at) })
	if j.room > 0 {
		n = min(n, j.room) // the rest is forgotten, not modelled
	}
	j.byHash = make(map[uint64]int32, n+seedLiveMax)
	j.pages = make([][]lruNode, (n+lruPage-1)/lruPage)
	for i := range j.pages {
		j.pages[i] = make([]lruNode, lruPage)
	}
}

// seedLiveMax bounds the model SeedSorted moves into the map Sort sized
// (what was placed since the seed began): a larger one keeps its map, and
// grows it in the steps.
const seedLiveMax = 4096

// SeedTrim is an eviction trim a seed deferred: the worker's oldest
// holdings beyond its engine's occupancy, to drop like ApplyKVReport's
// answer.
type SeedTrim struct {
	URL    string
	Hashes []uint64
}

// SeedResult is what one SeedStep leaves to its caller.
type SeedResult struct {
	// Sorts are to be sorted outside the lock and given to SeedSorted.
	Sorts []*SeedSort
	// Trims are to be applied as ApplyKVReport's answers are.
	Trims []SeedTrim
	// More: further steps have work (not counting Sorts given out).
	More bool
}

// Seeding reports whether a seed has steps left to run.
func (e *Engine) Seeding() bool {
	e.dropStaleSeeds()
	for _, w := range e.workers {
		if w.seed != nil && w.seed.phase != seedSorting {
			return true
		}
	}
	return false
}

// SeedStep does one bounded step of the seeds in progress, visiting at
// most limit index entries or adding limit/seedAddCost holdings: adding one worker's holdings to
// its model, else one step of the index walk, else starting a walk for
// the workers waiting. Callers hold their lock for one step at a time and
// repeat while More (and Sorts handed back) say there is work.
func (e *Engine) SeedStep(limit int) (r SeedResult) {
	limit = max(limit, 1)
	e.dropStaleSeeds()
	defer func() { r.More = e.Seeding() }()
	for _, w := range e.workers {
		if w.seed != nil && w.seed.phase == seedAdding {
			if t, ok := e.seedAdd(w, max(limit/seedAddCost, 1)); ok {
				r.Trims = append(r.Trims, t)
			}
			return r
		}
	}
	sd := &e.seeds
	if len(sd.by) > 0 {
		done, ok := e.idx.WalkUpStep(limit, e.collectSeeds)
		switch {
		case !ok:
			// The index was replaced under the walk (a snapshot
			// installed): what was collected may miss entries, so the
			// walk starts over.
			for _, s := range sd.by {
				s.walked = nil
			}
			e.idx.StartWalkUp()
		case done:
			for _, s := range sd.by {
				s.phase = seedSorting
				r.Sorts = append(r.Sorts, &SeedSort{seed: s, walked: s.walked, room: s.model.capacity})
				s.walked = nil // the sorter's now
			}
			clear(sd.by)
			sd.by = sd.by[:0]
		}
		return r
	}
	for _, w := range e.workers {
		if w.seed != nil && w.seed.phase == seedWaiting {
			w.seed.phase = seedWalking
			sd.by = append(sd.by, w.seed)
		}
	}
	if len(sd.by) > 0 {
		e.idx.StartWalkUp()
	}
	return r
}

// SeedSorted takes back sorted holdings; those of seeds abandoned in the
// meantime are dropped.
func (e *Engine) SeedSorted(jobs []*SeedSort) {
	for _, j := range jobs {
		s := j.seed
		if w, ok := e.byID[s.id]; ok && w.seed == s && w.model == s.model && s.phase == seedSorting {
			s.held, s.next, s.phase = j.held, 0, seedAdding
			if m := s.model; m.len() <= seedLiveMax && j.byHash != nil {
				for h, n := range m.byHash {
					j.byHash[h] = n
				}
				m.byHash = j.byHash
			}
			s.model.pages = append(s.model.pages, j.pages...)
		}
		*j = SeedSort{}
	}
}

// collectSeeds is the walk's visitor: each seeding worker's holding of an
// entry is collected.
func (e *Engine) collectSeeds(hash uint64, holders []index.Holder) {
	for _, h := range holders {
		for _, s := range e.seeds.by {
			if s.id == h.Worker {
				s.collect(seedHold{hash, h.At})
			}
		}
	}
}

// seedAddCost: walk visits an added holding costs. Adding one looks it up
// in two large maps (the model's and the index's) and inserts it in one,
// where a visit reads an entry it walks to (BenchmarkSeedStep: ~0.5 µs
// against ~0.1 µs at a million entries).
const seedAddCost = 4

// seedBlock is the size of the blocks a walk collects into (64 KiB).
const seedBlock = 4096

func (s *modelSeed) collect(h seedHold) {
	n := len(s.walked)
	if n == 0 || len(s.walked[n-1]) == seedBlock {
		s.walked = append(s.walked, make([]seedHold, 0, seedBlock))
		n++
	}
	s.walked[n-1] = append(s.walked[n-1], h)
}

// seedAdd adds up to limit of w's sorted holdings at its model's old end.
// When the last one is added the seed ends, with the eviction trim it
// deferred if any.
func (e *Engine) seedAdd(w *worker, limit int) (trim SeedTrim, ok bool) {
	s, m := w.seed, w.model
	forgot := e.evicted[:0]
	for end := min(s.next+limit, len(s.held)); s.next < end; s.next++ {
		h := s.held[s.next].hash
		if _, in := m.byHash[h]; in {
			continue // placed again since the walk: already at its place
		}
		if _, held := e.idx.HolderAt(h, w.id); !held {
			continue // evicted, withdrawn or expired since the walk
		}
		if m.capacity > 0 && m.len() >= m.capacity {
			forgot = append(forgot, h) // as a shrink after a one-shot seed would
			continue
		}
		m.pushBack(h)
	}
	e.evicted = forgot[:0]
	e.forget(w, forgot)
	if s.next < len(s.held) {
		return SeedTrim{}, false
	}
	w.seed = nil
	if !s.evicted || !w.kv.on {
		return SeedTrim{}, false
	}
	hs := e.kvTrim(w, nil)
	return SeedTrim{URL: w.spec.URL, Hashes: hs}, len(hs) > 0
}

// dropStaleSeeds abandons the seeds whose worker's model or id changed,
// or whose worker is gone.
func (e *Engine) dropStaleSeeds() {
	for _, w := range e.workers {
		if s := w.seed; s != nil && (s.model != w.model || s.id != w.id) {
			w.seed = nil
		}
	}
	sd := &e.seeds
	sd.by = slices.DeleteFunc(sd.by, func(s *modelSeed) bool {
		w, ok := e.byID[s.id]
		return !ok || w.seed != s
	})
	// With no seed left, the index walk is simply left behind.
}
