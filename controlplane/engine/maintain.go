package engine

import "github.com/cartrouter/cart/controlplane/index"

// purgePerEvict: slots a purge step visits per entry an eviction step
// removes. A 2,048-slot step holds the lock 90-200 µs (CPU, 1M entries,
// `go test -run '^$' -bench RemoveWorker ./controlplane/index`), against
// 46 ms for removing the worker at once.
const purgePerEvict = 16

// MaintainStep does one bounded step of index upkeep at now: the purge of
// removed workers' holdings, LRU eviction
// down to maxEntries, then expiry of placements past the TTL, then of idle
// sessions, touching at most chunk entries. Callers hold their lock for
// one step at a time and repeat until it reports done, so routing never
// waits behind a whole pass.
func (e *Engine) MaintainStep(now int64, maxEntries, chunk int) (done bool) {
	// Purging a removed worker only reads most slots it visits, hence
	// more of them per step than evictions.
	if !e.PurgeStep(chunk) {
		return false
	}
	if _, done := e.idx.Evict(maxEntries, chunk); !done {
		return false
	}
	if e.pol.TTL > 0 {
		if _, done := e.idx.ExpireBefore(now-e.pol.TTL, chunk); !done {
			return false
		}
	}
	if e.pol.SessionTTL > 0 {
		if _, done := e.ExpireSessions(now, chunk); !done {
			return false
		}
	}
	return true
}

// ClearIndex empties the index, and every worker's model with it (the
// daily reset), without a pass over the index under the caller's lock;
// the index's map for what comes next is r (see index.Reserved).
//
// An event-fed worker's model goes (its seed with it) rather than
// restarting empty: a snapshot's install fills the index again right after,
// and the worker's next KV report then seeds a new model from what the
// index holds by then (for the daily reset: nothing). An empty model over a
// refilled index would trim its newest blocks first.
func (e *Engine) ClearIndex(r *index.Reserved) {
	for _, w := range e.workers {
		switch {
		case w.kv.on:
			w.model, w.seed = nil, nil
		case w.model != nil:
			w.model = newBlockLRU(w.model.capacity)
		}
	}
	e.idx.ResetTo(r)
}

// PurgeStep drops removed workers' holdings from a step's worth of index
// slots (chunk times purgePerEvict) and reports whether none are left.
func (e *Engine) PurgeStep(chunk int) (done bool) {
	return e.idx.PurgeStep(chunk * purgePerEvict)
}
