package engine

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
	w.kv = kvFeed{on: true, capacity: max(r.CapacityBlocks, 0), occupied: max(r.OccupiedBlocks, 0), occupiedTokens: r.OccupiedTokens, capacityTokens: r.CapacityTokens}
	e.resizeModel(w)
	if r.Evicted && w.model != nil {
		if w.seed != nil && w.seed.model == w.model {
			// While seeding, the model lacks the oldest holdings: its
			// tail is not the oldest, and its length is short of what
			// the worker holds. The trim waits for the end of the seed
			// (SeedResult.Trims), sized by the occupancy reported then.
			w.seed.evicted = true
			return dst
		}
		dst = e.kvTrim(w, dst)
	}
	return dst
}

// kvTrim appends to dst w's oldest modelled holdings beyond its engine's
// reported occupancy.
func (e *Engine) kvTrim(w *worker, dst []uint64) []uint64 {
	excess := w.model.len() - w.kv.occupied
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
	return true
}
