package engine

import "cmp"

// This file holds the corrections the engines' own KV-cache events make to
// the index (controlplane/kvtruth reads the events). While a worker's events
// flow complete, its modelled capacity is what its engine reports, not the
// declared or learned guess; when they stop being complete the worker goes
// back to that guess (the approximate mode).

// kvFeed is a worker's event-fed state.
type kvFeed struct {
	on bool
	// capacity is the modelled capacity in blocks the events give; 0 until
	// the engine has evicted (an engine that never evicted needs nothing
	// forgotten).
	capacity int
	// occupied is the engine's reported occupancy in blocks.
	occupied int
	// The same in the engine's tokens, for display.
	occupiedTokens, capacityTokens int64
	// stores follows what the engine stored, to age the model by the
	// stores CART did not cause.
	stores storeLedger
}

// storeLedger tells, of the engine's latest stores, how many CART did not
// place: requests that reached the engine some other way, recomputation,
// blocks CART took for held. An LRU engine keeps its latest stores, so
// these take room that CART's model, which sees only CART's placements,
// would otherwise count as its own holdings: the model is trimmed to the
// engine's capacity less them. That is what makes an engine flushed by
// traffic CART never saw lose its holdings in CART's view too, without
// CART knowing the engine's block hashes (its own are of characters, the
// engine's of tokens).
type storeLedger struct {
	// buckets are the engine's latest stores, oldest first, covering at
	// most the engine's capacity in about ledgerBuckets buckets; total and
	// foreign sum them.
	buckets        []storeBucket
	total, foreign int
	// placed counts the blocks CART placed on the worker since the last
	// report; owed those the engine has not reported storing yet (it
	// stores them as it prefills, after CART routed).
	placed, owed int
}

// storeBucket is a run of consecutive stores, foreign of them CART's not.
type storeBucket struct{ blocks, foreign int }

// ledgerBuckets is the ledger's resolution: the window is trimmed a
// bucket (1/64 of the capacity) at a time, proportionally within one.
const ledgerBuckets = 64

// record accounts for stored blocks the engine reported since the last
// report, with capacity the engine's size (0: unknown, nothing kept).
func (l *storeLedger) record(stored, capacity int) {
	stored = max(stored, 0)
	owed := l.owed + l.placed
	cart := min(stored, owed)
	// A placement the engine never stored (CART predicted a miss the
	// engine served from cache) is not owed beyond a cache's worth.
	l.owed, l.placed = min(owed-cart, max(capacity, 0)), 0
	if capacity <= 0 {
		*l = storeLedger{}
		return
	}
	size := max(capacity/ledgerBuckets, 1)
	if n := len(l.buckets); n == 0 || l.buckets[n-1].blocks >= size {
		l.buckets = append(l.buckets, storeBucket{})
	}
	last := &l.buckets[len(l.buckets)-1]
	last.blocks += stored
	last.foreign += stored - cart
	l.total += stored
	l.foreign += stored - cart
	for l.total > capacity && len(l.buckets) > 0 {
		b := &l.buckets[0]
		drop := min(b.blocks, l.total-capacity)
		// Within a bucket the order is not kept: drop proportionally.
		f := b.foreign * drop / b.blocks
		b.blocks -= drop
		b.foreign -= f
		l.total -= drop
		l.foreign -= f
		if b.blocks == 0 {
			l.buckets = l.buckets[1:]
		}
	}
}

// KVReport is what a worker's KV events say about its prefix cache, in
// index blocks (the caller converts the engine's tokens).
type KVReport struct {
	// Synced: every event since a known state arrived. False degrades the
	// worker to the approximate mode: the rest of the report is ignored.
	Synced bool
	// OccupiedBlocks is what the engine holds now.
	OccupiedBlocks int
	// CapacityBlocks is the engine's cache size as far as known (its peak
	// occupancy once it has evicted), 0 while it has never evicted.
	CapacityBlocks int
	// Evicted says the engine removed blocks since the last report: the
	// worker's oldest holdings beyond OccupiedBlocks are to go.
	Evicted bool
	// StoredBlocks is how many blocks the engine newly stored since the
	// last report (CART's placements and whatever else it served).
	StoredBlocks int
	// OccupiedTokens and CapacityTokens are the same in the engine's
	// tokens, kept for display only.
	OccupiedTokens, CapacityTokens int64
}

// KVState is a worker's event-fed view, for /workers and metrics.
type KVState struct {
	// On: the engine's events drive this worker's model.
	On             bool
	OccupiedBlocks int
	CapacityBlocks int
	OccupiedTokens int64
	CapacityTokens int64
}

// KV returns a worker's event-fed state (zero for unknown workers).
func (e *Engine) KV(url string) KVState {
	w, ok := e.byURL[url]
	if !ok {
		return KVState{}
	}
	return KVState{On: w.kv.on, OccupiedBlocks: w.kv.occupied, CapacityBlocks: w.kv.capacity, OccupiedTokens: w.kv.occupiedTokens, CapacityTokens: w.kv.capacityTokens}
}

// ApplyKVReport makes a worker's model follow its engine's report and
// returns, appended to dst, the worker's oldest holdings beyond what the
// engine reports holding after an eviction. It does not drop them: the
// caller removes them (RemoveHoldings in process, a replicated withdrawal
// in the control plane), so the index changes the same way on every node.
func (e *Engine) ApplyKVReport(url string, r KVReport, dst []uint64) []uint64 {
	w, ok := e.byURL[url]
	if !ok {
		return dst
	}
	if !r.Synced {
		if w.kv.on {
			w.kv = kvFeed{}
			if w.model != nil {
				// Back to the declared (or learned from here) capacity.
				w.model.capacity = e.configuredCapacity(w)
			}
			e.resizeModel(w)
		}
		return dst
	}
	stores := w.kv.stores
	if !w.kv.on {
		stores = storeLedger{} // the stream was not followed until now
	}
	w.kv = kvFeed{on: true, capacity: max(r.CapacityBlocks, 0), occupied: max(r.OccupiedBlocks, 0), occupiedTokens: r.OccupiedTokens, capacityTokens: r.CapacityTokens, stores: stores}
	w.kv.stores.record(r.StoredBlocks, w.kv.capacity)
	e.resizeModel(w)
	if (r.Evicted || w.kv.stores.foreign > 0) && w.model != nil {
		if w.seed != nil && w.seed.model == w.model {
			// While seeding, the model lacks the oldest holdings: its
			// tail is not the oldest, and its length is short of what
			// the worker holds. The trim waits for the end of the seed
			// (SeedResult.Trims), sized by the occupancy reported then.
			w.seed.evicted = w.seed.evicted || r.Evicted
			return dst
		}
		target := -1
		if r.Evicted {
			target = w.kv.occupied
		}
		if f := w.kv.stores.foreign; f > 0 && w.kv.capacity > 0 && (target < 0 || w.kv.capacity-f < target) {
			target = max(w.kv.capacity-f, 0)
		}
		dst = e.kvTrimTo(w, target, dst)
	}
	return dst
}

// kvRoomCmp compares the free room of two event-fed workers' engines
// (their capacity, as the events show it or else as declared, less the
// occupancy the events report): 1 when a has more, -1 when b has, 0 when
// equal or either is not event-fed with a capacity. An LRU engine is full
// once warm, so this tells an engine that restarted or was cleared (it has
// room) from the others: the prefixes it lost and new ones fill it again,
// instead of pushing others' out at random.
func (e *Engine) kvRoomCmp(a, b *worker) int {
	ra, oka := e.kvRoom(a)
	rb, okb := e.kvRoom(b)
	if !oka || !okb {
		return 0
	}
	return cmp.Compare(ra, rb)
}

func (e *Engine) kvRoom(w *worker) (int, bool) {
	if !w.kv.on {
		return 0, false
	}
	c := w.kv.capacity
	if c <= 0 {
		c = e.configuredCapacity(w)
	}
	return c - w.kv.occupied, c > 0
}

// kvPlaced counts blocks CART placed on an event-fed worker (new in its
// model), which the engine's next stores are expected to be.
func (w *worker) kvPlaced(n int) {
	if w.kv.on {
		w.kv.stores.placed += n
	}
}

// kvTrim appends to dst w's oldest modelled holdings beyond its engine's
// reported occupancy.
func (e *Engine) kvTrim(w *worker, dst []uint64) []uint64 {
	return e.kvTrimTo(w, w.kv.occupied, dst)
}

// kvTrimTo appends to dst w's oldest modelled holdings beyond target.
func (e *Engine) kvTrimTo(w *worker, target int, dst []uint64) []uint64 {
	if target < 0 {
		return dst
	}
	excess := w.model.len() - target
	for n := w.model.tail; n >= 0 && excess > 0; n = w.model.node(n).prev {
		dst = append(dst, w.model.node(n).hash)
		excess--
	}
	return dst
}

// resizeFromKV sets the model of an event-fed worker to the engine's
// reported capacity (growing or shrinking it: the report is the truth).
func (e *Engine) resizeFromKV(w *worker) {
	if w.model == nil {
		// Events arrived for a worker nobody modelled yet: its model
		// starts empty and live, and what the index already holds for it
		// comes in SeedSteps (seed.go), not in a pass over the index here.
		w.model = newBlockLRU(0)
		w.seed = &modelSeed{id: w.id, model: w.model}
	}
	w.model.capacity = w.kv.capacity
	e.forget(w, w.model.shrink(nil))
}

// RemoveHoldings drops url as a holder of hashes (ApplyKVReport's answer).
func (e *Engine) RemoveHoldings(url string, hashes []uint64) {
	if w, ok := e.byURL[url]; ok && len(hashes) > 0 {
		e.idx.RemoveHolder(hashes, w.id)
	}
}

// ClearHoldings drops every holding of url: its engine reported its cache
// cleared (AllBlocksCleared, a restart). The worker takes a fresh index id
// and its old one is retired, in O(1) (PurgeStep drops the old entries in
// steps; a pass over the index took 46 ms at a million entries): from here
// it holds nothing and its model starts empty. Sessions kept on it end with
// the old id, as the cache they were kept for did. It reports whether the
// worker is known.
func (e *Engine) ClearHoldings(url string) bool {
	w, ok := e.byURL[url]
	if !ok {
		return false
	}
	delete(e.byID, w.id)
	e.idx.RetireWorker(w.id)
	w.id = e.nextID
	e.nextID++
	e.byID[w.id] = w
	if w.model != nil {
		w.model = newBlockLRU(w.model.capacity)
	}
	w.kv.occupied, w.kv.occupiedTokens = 0, 0
	w.kv.stores = storeLedger{}
	return true
}
