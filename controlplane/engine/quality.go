package engine

import (
	"github.com/cartrouter/cart/controlplane/index"
)

// This file holds the routing-quality mechanisms that go beyond "last sent
// where": a capacity model per worker, a closed loop on reported cache
// hits, session affinity and hot-prefix spreading. Each is off at its
// Policy zero value.

// ---- capacity model -------------------------------------------------------

// blockLRU models one worker's prefix cache as an LRU of block hashes. It
// is what lets the index forget prefixes a replica has most likely
// evicted: when the model evicts a block, the worker stops being a holder.
type blockLRU struct {
	capacity   int // blocks; 0 = unbounded
	byHash     map[uint64]int32
	nodes      []lruNode
	free       []int32
	head, tail int32
}

type lruNode struct {
	hash       uint64
	prev, next int32
}

func newBlockLRU(capacity int) *blockLRU {
	return &blockLRU{capacity: capacity, byHash: map[uint64]int32{}, head: -1, tail: -1}
}

func (l *blockLRU) len() int { return len(l.byHash) }

// touch moves hashes to the front (leaf first, root last, like the index)
// and returns the hashes evicted to stay within capacity, appended to dst.
func (l *blockLRU) touch(hashes []uint64, dst []uint64) []uint64 {
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		if n, ok := l.byHash[h]; ok {
			l.unlink(n)
			l.pushFront(n)
			continue
		}
		var n int32
		if k := len(l.free); k > 0 {
			n = l.free[k-1]
			l.free = l.free[:k-1]
		} else {
			l.nodes = append(l.nodes, lruNode{})
			n = int32(len(l.nodes) - 1)
		}
		l.nodes[n] = lruNode{hash: h, prev: -1, next: -1}
		l.byHash[h] = n
		l.pushFront(n)
	}
	return l.shrink(dst)
}

// shrink evicts from the tail down to capacity.
func (l *blockLRU) shrink(dst []uint64) []uint64 {
	for l.capacity > 0 && len(l.byHash) > l.capacity && l.tail >= 0 {
		n := l.tail
		dst = append(dst, l.nodes[n].hash)
		l.drop(n)
	}
	return dst
}

func (l *blockLRU) remove(hashes []uint64) {
	for _, h := range hashes {
		l.remove1(h)
	}
}

func (l *blockLRU) remove1(h uint64) {
	if n, ok := l.byHash[h]; ok {
		l.drop(n)
	}
}

func (l *blockLRU) drop(n int32) {
	l.unlink(n)
	delete(l.byHash, l.nodes[n].hash)
	l.free = append(l.free, n)
}

func (l *blockLRU) unlink(n int32) {
	nd := &l.nodes[n]
	if nd.prev >= 0 {
		l.nodes[nd.prev].next = nd.next
	} else if l.head == n {
		l.head = nd.next
	}
	if nd.next >= 0 {
		l.nodes[nd.next].prev = nd.prev
	} else if l.tail == n {
		l.tail = nd.prev
	}
	nd.prev, nd.next = -1, -1
}

func (l *blockLRU) pushFront(n int32) {
	nd := &l.nodes[n]
	nd.prev, nd.next = -1, l.head
	if l.head >= 0 {
		l.nodes[l.head].prev = n
	}
	l.head = n
	if l.tail < 0 {
		l.tail = n
	}
}

// configuredCapacity is the capacity a worker's spec or the policy gives.
func (e *Engine) configuredCapacity(w *worker) int {
	if w.spec.CapacityBlocks > 0 {
		return w.spec.CapacityBlocks
	}
	return e.pol.CapacityBlocks
}

// resizeModel creates or resizes w's cache model. Workers need a model
// when a capacity is configured or the closed loop may learn one.
func (e *Engine) resizeModel(w *worker) {
	if w.kv.on {
		e.resizeFromKV(w)
		return
	}
	capacity := e.configuredCapacity(w)
	if capacity == 0 && !e.pol.ClosedLoop {
		w.model = nil
		return
	}
	if w.model == nil {
		w.model = newBlockLRU(capacity)
		return
	}
	if capacity > 0 && (w.model.capacity == 0 || w.model.capacity > capacity) {
		w.model.capacity = capacity
		e.forget(w, w.model.shrink(nil))
	}
}

// modelTouch records hashes in w's model. When the index skipped part of
// the path (it was full), only the leading blocks it actually records for
// w are modelled: a model must never hold a block the index does not, or
// it outgrows the index it is meant to trim.
func (e *Engine) modelTouch(w *worker, hashes []uint64, partial bool) {
	if w.model == nil {
		return
	}
	if partial {
		n := 0
		for n < len(hashes) {
			if _, ok := e.idx.HolderAt(hashes[n], w.id); !ok {
				break
			}
			n++
		}
		hashes = hashes[:n]
	}
	e.evicted = w.model.touch(hashes, e.evicted[:0])
	e.forget(w, e.evicted)
}

// released is the index's OnRelease hook: a block the index no longer
// records for a worker (evicted, expired, cleared, withdrawn) leaves that
// worker's model too, so every model stays within the index's own bound
// whatever its modelled capacity.
func (e *Engine) released(hash uint64, id index.WorkerID) {
	if w, ok := e.byID[id]; ok && w.model != nil {
		w.model.remove1(hash)
	}
}

// forget drops w as a holder of blocks its model evicted.
func (e *Engine) forget(w *worker, hashes []uint64) {
	if len(hashes) > 0 {
		e.idx.RemoveHolder(hashes, w.id)
	}
}

// ---- closed loop -------------------------------------------------------

// Accuracy compares what the index predicted for a worker with the cached
// tokens the worker reported.
type Accuracy struct {
	Reports         uint64 // completions with a usage report
	PredictedTokens uint64 // Σ predicted cached prompt tokens
	ActualTokens    uint64 // Σ reported cached prompt tokens
	Misses          uint64 // reports far below the prediction
	ModelBlocks     int    // blocks in the worker's cache model
	// ModelCapacity is the current modelled capacity in blocks; 0 means
	// no learned or configured limit, so the model is bounded by the
	// index alone (it never holds a block the index dropped).
	ModelCapacity int
}

func (w *worker) accuracy() Accuracy {
	a := w.acc
	if w.model != nil {
		a.ModelBlocks, a.ModelCapacity = w.model.len(), w.model.capacity
	}
	return a
}

// Feedback thresholds. A report counts as a miss when the worker had less
// than missFraction of the predicted prefix cached; predictions younger
// than settleNanos are not judged, because the worker may still have been
// computing the prefix when the request arrived (engines insert blocks
// after prefill, so a burst legitimately sees fewer hits than predicted).
const (
	missFraction = 0.5
	settleNanos  = int64(2e9)
	shrinkFactor = 0.9
	growFactor   = 1.01
	minCapacity  = 64 // blocks: never model a cache smaller than this
)

// Feedback reports a completed request's usage: the worker had
// cachedTokens of promptTokens cached, where the decision predicted
// predictedChars of keyLen characters placed placedAgo nanoseconds
// earlier. With the closed loop on, a worker that had far less than
// predicted gets a smaller modelled capacity (its oldest entries are
// dropped from the index); one that keeps confirming predictions slowly
// regains capacity up to its configured size.
func (e *Engine) Feedback(url string, keyLen, predictedChars int, placedAgo int64, promptTokens, cachedTokens int) {
	w, ok := e.byURL[url]
	if !ok || promptTokens <= 0 || cachedTokens < 0 || keyLen <= 0 {
		return
	}
	// Scale characters to the worker's own token count rather than
	// assuming a fixed characters-per-token ratio.
	predicted := predictedChars * promptTokens / keyLen
	w.acc.Reports++
	w.acc.PredictedTokens += uint64(predicted)
	w.acc.ActualTokens += uint64(cachedTokens)
	// The engine's own events, while they flow, are the truth the loop
	// would only guess at.
	if !e.pol.ClosedLoop || w.model == nil || w.kv.on || predicted <= 0 || placedAgo < settleNanos {
		return
	}
	if float64(cachedTokens) < missFraction*float64(predicted) {
		w.acc.Misses++
		capacity := int(float64(w.model.len()) * shrinkFactor)
		if capacity < minCapacity {
			capacity = minCapacity
		}
		if w.model.capacity == 0 || capacity < w.model.capacity {
			w.model.capacity = capacity
		}
		e.forget(w, w.model.shrink(nil))
		return
	}
	if w.model.capacity > 0 {
		grown := int(float64(w.model.capacity)*growFactor) + 1
		if limit := e.configuredCapacity(w); limit > 0 && grown > limit {
			grown = limit
		}
		// With nothing configured, growth stops at the index's own bound:
		// beyond it a limit means nothing, and a limit grown without
		// bound would take as long to cut back on the next miss.
		if e.configuredCapacity(w) == 0 && grown >= e.idx.Ceiling() {
			grown = 0
		}
		w.model.capacity = grown
	}
}

// placedAgo returns how long ago w was sent the block hash (-1 unknown).
func (e *Engine) placedAgo(hash uint64, w index.WorkerID, now int64) int64 {
	if at, ok := e.idx.HolderAt(hash, w); ok {
		return now - at
	}
	return -1
}

// ---- hot prefixes -------------------------------------------------------

// hotTracker estimates how often prefixes of sampled depths (1, 2, 4, ...
// blocks) occur in recent traffic, with exponential decay so the estimate
// follows the workload. A prefix in at least HotFraction of requests is
// hot: everybody should hold it, so holding it is no reason to prefer a
// worker.
type hotTracker struct {
	counts map[uint64]float64
	total  float64
	since  int // requests since the last decay
}

const (
	hotMaxDepth   = 1 << 10 // blocks
	hotDecayEvery = 256     // requests
	hotDecay      = 0.5
	hotMinTotal   = 32 // requests before anything counts as hot
)

func (t *hotTracker) observe(hashes []uint64, fraction float64) {
	if fraction <= 0 {
		return
	}
	if t.counts == nil {
		t.counts = map[uint64]float64{}
	}
	for d := 1; d <= len(hashes) && d <= hotMaxDepth; d *= 2 {
		t.counts[hashes[d-1]]++
	}
	t.total++
	t.since++
	if t.since >= hotDecayEvery {
		t.since = 0
		t.total *= hotDecay
		for k, v := range t.counts {
			if v *= hotDecay; v < 0.5 {
				delete(t.counts, k)
			} else {
				t.counts[k] = v
			}
		}
	}
}

// depth returns the deepest sampled prefix of hashes that is hot, in
// blocks (0 when none is).
func (t *hotTracker) depth(hashes []uint64, fraction float64) int {
	if fraction <= 0 || t.total < hotMinTotal {
		return 0
	}
	hot := 0
	for d := 1; d <= len(hashes) && d <= hotMaxDepth; d *= 2 {
		if t.counts[hashes[d-1]] < fraction*t.total {
			break
		}
		hot = d
	}
	return hot
}

// ---- maintenance ------------------------------------------------------

// MaintainStep does one bounded step of index upkeep at now: LRU eviction
// down to maxEntries, then expiry of placements past the TTL, then of idle
// sessions, touching at most chunk entries. Callers hold their lock for
// one step at a time and repeat until it reports done, so routing never
// waits behind a whole pass.
func (e *Engine) MaintainStep(now int64, maxEntries, chunk int) (done bool) {
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
