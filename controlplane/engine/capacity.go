package engine

import (
	"github.com/cartrouter/cart/controlplane/index"
)

// The capacity model: each worker's prefix cache modelled as an LRU of
// block hashes, so the index forgets what a replica has most likely
// evicted. Off at its Policy zero value.

// blockLRU models one worker's prefix cache as an LRU of block hashes. It
// is what lets the index forget prefixes a replica has most likely
// evicted: when the model evicts a block, the worker stops being a holder.
type blockLRU struct {
	capacity int // blocks; 0 = unbounded
	byHash   map[uint64]int32
	// pages hold the nodes, lruPage at a time: one slice doubling under
	// the routing lock would copy megabytes and pay the garbage
	// collector's assist for them in a single hold (measured while seeding
	// a model of 125k blocks: holds of 2-13 ms at each doubling).
	pages      [][]lruNode
	nslots     int32
	free       []int32
	head, tail int32
}

const (
	lruPageShift = 12
	lruPage      = 1 << lruPageShift // nodes per page (64 KiB)
)

type lruNode struct {
	hash       uint64
	prev, next int32
}

func newBlockLRU(capacity int) *blockLRU {
	return &blockLRU{capacity: capacity, byHash: map[uint64]int32{}, head: -1, tail: -1}
}

func (l *blockLRU) len() int { return len(l.byHash) }

func (l *blockLRU) node(n int32) *lruNode { return &l.pages[n>>lruPageShift][n&(lruPage-1)] }

// take returns a free node slot.
func (l *blockLRU) take() int32 {
	if k := len(l.free); k > 0 {
		n := l.free[k-1]
		l.free = l.free[:k-1]
		return n
	}
	if int(l.nslots) == len(l.pages)*lruPage {
		l.pages = append(l.pages, make([]lruNode, lruPage))
	}
	l.nslots++
	return l.nslots - 1
}

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
		n := l.take()
		*l.node(n) = lruNode{hash: h, prev: -1, next: -1}
		l.byHash[h] = n
		l.pushFront(n)
	}
	return l.shrink(dst)
}

// pushBack adds h, which the model must not hold, at the old end: it is
// older than everything modelled (a seed's holdings, seed.go). Capacity is
// the caller's to respect.
func (l *blockLRU) pushBack(h uint64) {
	n := l.take()
	*l.node(n) = lruNode{hash: h, prev: l.tail, next: -1}
	l.byHash[h] = n
	if l.tail >= 0 {
		l.node(l.tail).next = n
	} else {
		l.head = n
	}
	l.tail = n
}

// shrink evicts from the tail down to capacity.
func (l *blockLRU) shrink(dst []uint64) []uint64 {
	for l.capacity > 0 && len(l.byHash) > l.capacity && l.tail >= 0 {
		n := l.tail
		dst = append(dst, l.node(n).hash)
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
	delete(l.byHash, l.node(n).hash)
	l.free = append(l.free, n)
}

func (l *blockLRU) unlink(n int32) {
	nd := l.node(n)
	if nd.prev >= 0 {
		l.node(nd.prev).next = nd.next
	} else if l.head == n {
		l.head = nd.next
	}
	if nd.next >= 0 {
		l.node(nd.next).prev = nd.prev
	} else if l.tail == n {
		l.tail = nd.prev
	}
	nd.prev, nd.next = -1, -1
}

func (l *blockLRU) pushFront(n int32) {
	nd := l.node(n)
	nd.prev, nd.next = -1, l.head
	if l.head >= 0 {
		l.node(l.head).prev = n
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
		hashes = hashes[:e.idx.HeldPrefix(hashes, w.id)]
	}
	before := w.model.len()
	e.evicted = w.model.touch(hashes, e.evicted[:0])
	w.kvPlaced(w.model.len() - before + len(e.evicted))
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
