package sim

import (
	"container/list"
	"slices"
	"sync"
)

// prefixCache is a block-granular LRU set of chained block hashes, standing in
// for the KV-cache block pool of an inference engine.
type prefixCache struct {
	mu       sync.Mutex
	capacity int // in blocks; 0 = unbounded
	blocks   map[uint64]*list.Element
	lru      list.List // of uint64 hashes; front = most recently used
}

func newPrefixCache(capacityBlocks int) *prefixCache {
	return &prefixCache{capacity: capacityBlocks, blocks: make(map[uint64]*list.Element)}
}

// match returns how many leading blocks of hashes are cached and marks them
// as used. Because hashes are chained, the first miss ends the match: a later
// block cannot be valid without the blocks before it.
func (c *prefixCache) match(hashes []uint64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.prefixLocked(hashes)
	c.touchLocked(hashes[:n])
	return n
}

// prefixLocked counts the leading hashes that are cached.
func (c *prefixCache) prefixLocked(hashes []uint64) int {
	n := 0
	for n < len(hashes) {
		if _, ok := c.blocks[hashes[n]]; !ok {
			break
		}
		n++
	}
	return n
}

// insert adds all hashes (refreshing those already present) and evicts the
// least recently used blocks beyond capacity. If changed is not nil it is
// called, still under the cache's lock so that successive calls report
// changes in the order they happened, with the indexes of hashes that were
// not cached before (ascending) and the hashes evicted, when either is
// non-empty. A block may be both, when the prompt alone exceeds capacity.
func (c *prefixCache) insert(hashes []uint64, changed func(added []int, evicted []uint64)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var added []int
	var evicted []uint64
	// Add in reverse so that, like touchLocked, block 0 ends up the most
	// recently used. If the prompt alone exceeds capacity, eviction then
	// drops its own tail and keeps the prefix that can still be matched.
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		if e, ok := c.blocks[h]; ok {
			c.lru.MoveToFront(e)
		} else {
			c.blocks[h] = c.lru.PushFront(h)
			added = append(added, i)
		}
		evicted = c.evictLocked(evicted)
	}
	if changed != nil && (len(added) > 0 || len(evicted) > 0) {
		slices.Reverse(added)
		changed(added, evicted)
	}
}

// touchLocked marks a prompt's blocks as used, tail first. vLLM frees a
// finished sequence's blocks in reverse order so that, among equally old
// blocks, suffixes are evicted before the prefixes they depend on; refreshing
// in reverse gives the same order here.
func (c *prefixCache) touchLocked(hashes []uint64) {
	for i := len(hashes) - 1; i >= 0; i-- {
		c.lru.MoveToFront(c.blocks[hashes[i]])
	}
}

// evictLocked drops blocks beyond capacity, appending their hashes to
// evicted.
func (c *prefixCache) evictLocked(evicted []uint64) []uint64 {
	for c.capacity > 0 && c.lru.Len() > c.capacity {
		oldest := c.lru.Back()
		c.lru.Remove(oldest)
		h := oldest.Value.(uint64)
		delete(c.blocks, h)
		evicted = append(evicted, h)
	}
	return evicted
}

// len returns the number of cached blocks.
func (c *prefixCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

// reset empties the cache, calling cleared (if not nil) under its lock.
func (c *prefixCache) reset(cleared func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.blocks)
	c.lru.Init()
	if cleared != nil {
		cleared()
	}
}

// usage is the fraction of the capacity held (0 when unbounded).
func (c *prefixCache) usage() float64 {
	if c.capacity <= 0 {
		return 0
	}
	return float64(c.len()) / float64(c.capacity)
}
