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
	held  []seedHold
	next  int // the next of held to add
	// evicted: an Evicted report came while seeding. Its trim waits for
	// the end of the seed (see ApplyKVReport).
	evicted bool
}

// seeder is the engine's side of the seeds in progress.
type seeder struct {
	walking bool         // an index walk collects for the seeds in by
	by      []*modelSeed // the seeds the walk collects for (few: one per worker)
}

// SeedSort is one worker's collected holdings, ordered by Sort outside the
// routing lock and handed back with SeedSorted.
type SeedSort struct {
	seed *modelSeed
	held []seedHold
}

// Sort puts the holdings in model order: most recently sent first, ties
// in the index's own LRU order (the walk collected them oldest first).
// Sorting a quarter of a million holdings takes tens of milliseconds,
// which is why it runs outside the lock.
func (j *SeedSort) Sort() {
	slices.Reverse(j.held)
	slices.SortStableFunc(j.held, func(x, y seedHold) int { return cmp.Compare(y.at, x.at) })
}

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

// SeedStep does one bounded step of the seeds in progress, touching at
// most limit index entries or holdings: adding one worker's holdings to
// its model, else one step of the index walk, else starting a walk for
// the workers waiting. Callers hold their lock for one step at a time and
// repeat while More (and Sorts handed back) say there is work.
func (e *Engine) SeedStep(limit int) (r SeedResult) {
	limit = max(limit, 1)
	e.dropStaleSeeds()
	defer func() { r.More = e.Seeding() }()
	for _, w := range e.workers {
		if w.seed != nil && w.seed.phase == seedAdding {
			if t, ok := e.seedAdd(w, limit); ok {
				r.Trims = append(r.Trims, t)
			}
			return r
		}
	}
	sd := &e.seeds
	if sd.walking {
		done, ok := e.idx.WalkUpStep(limit, e.collectSeeds)
		switch {
		case !ok:
			// The index was replaced under the walk (a snapshot
			// installed): what was collected may miss entries, so the
			// walk starts over.
			for _, s := range sd.by {
				s.held = s.held[:0]
			}
			e.idx.StartWalkUp()
		case done:
			for _, s := range sd.by {
				s.phase = seedSorting
				r.Sorts = append(r.Sorts, &SeedSort{seed: s, held: s.held})
				s.held = nil // the sorter's now
			}
			sd.walking = false
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
		sd.walking = true
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
		}
		j.held = nil
	}
}

// collectSeeds is the walk's visitor: each seeding worker's holding of an
// entry is collected.
func (e *Engine) collectSeeds(hash uint64, holders []index.Holder) {
	for _, h := range holders {
		for _, s := range e.seeds.by {
			if s.id == h.Worker {
				s.held = append(s.held, seedHold{hash, h.At})
			}
		}
	}
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
	if sd.walking && len(sd.by) == 0 {
		sd.walking = false // the index walk is simply left behind
	}
}
