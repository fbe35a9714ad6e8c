package index

import (
	"errors"
	"slices"
	"sync/atomic"
)

// The slab is cut into pages of pageSize entries, and the page pointers
// into chunks of chunkPages, so that a snapshot can freeze the index by
// copying one pointer per chunk (16 at a million entries) instead of
// copying every entry under the routing lock. While a frozen view is
// alive, the first write to a chunk or a page copies it (copy on write);
// what nobody writes stays shared. A page is small so that one decision,
// which writes a few slots (its path and their LRU neighbours), copies
// little: 64 entries are about 4.6 KB, a chunk 8 KB.
const (
	pageShift  = 6
	pageSize   = 1 << pageShift
	pageMask   = pageSize - 1
	chunkShift = 10
	chunkPages = 1 << chunkShift
	chunkMask  = chunkPages - 1
	slotsShift = pageShift + chunkShift // slot -> chunk
)

type page struct {
	e [pageSize]entry
}

type chunk struct {
	// gen is the generation that owns the chunk: the live index may write
	// it in place only while gen equals the index's current generation.
	gen uint64
	// owned marks the pages already copied for gen (valid while gen is
	// current): the others may be shared with a frozen view. Kept here
	// rather than in each page so that checking costs no cache miss
	// beyond the entry's own.
	owned [chunkPages / 64]uint64
	p     [chunkPages]*page
}

// cow is the copy-on-write bookkeeping.
type cow struct {
	// gen is bumped by every Freeze: chunks of an older generation, and
	// pages not marked owned, may be shared with a frozen view.
	gen uint64
	// views counts frozen views not yet released. With none, everything
	// is written in place: nobody else reads it (Release comes after a
	// view's last read). Atomic because a view is released by whoever
	// wrote it out, outside the routing lock.
	views atomic.Int64
}

// at returns slot s for reading only.
func (x *Index) at(s int32) *entry {
	return &x.chunks[s>>slotsShift].p[(s>>pageShift)&chunkMask].e[s&pageMask]
}

// mut returns slot s for writing. Only while a frozen view is alive does
// it check ownership and copy: the steady state pays one atomic load.
func (x *Index) mut(s int32) *entry {
	if x.shared() {
		return x.mutShared(s)
	}
	return x.at(s)
}

// shared reports whether a frozen view is alive, so writes must copy.
func (x *Index) shared() bool { return x.cow.views.Load() != 0 }

// mutShared is mut while a view is alive (shared), kept apart so that
// the hot paths can inline the test and skip the call.
func (x *Index) mutShared(s int32) *entry {
	c := x.ownChunk(s >> slotsShift)
	pi := (s >> pageShift) & chunkMask
	if c.owned[pi>>6]&(1<<(pi&63)) == 0 {
		np := new(page)
		*np = *c.p[pi]
		for j := range np.e {
			// Holder lists are written in place (times refreshed,
			// holders swapped out), so the copy gets its own.
			if m := np.e[j].more; m != nil {
				np.e[j].more = slices.Clone(m)
			}
		}
		c.p[pi] = np
		c.owned[pi>>6] |= 1 << (pi & 63)
	}
	return &c.p[pi].e[s&pageMask]
}

// ownChunk returns chunk i, first copying it if it predates the last
// Freeze (a view may share it). Only called while a view is alive.
func (x *Index) ownChunk(i int32) *chunk {
	c := x.chunks[i]
	if c.gen == x.cow.gen {
		return c
	}
	nc := new(chunk)
	nc.gen = x.cow.gen
	nc.p = c.p
	x.chunks[i] = nc
	return nc
}

// grow hands out a never-used slot, adding a chunk or a page when needed.
func (x *Index) grow() int32 {
	s := x.nslots
	ci := s >> slotsShift
	if int(ci) == len(x.chunks) {
		x.chunks = append(x.chunks, &chunk{gen: x.cow.gen})
	}
	if s&pageMask == 0 {
		c := x.chunks[ci]
		if x.cow.views.Load() != 0 {
			c = x.ownChunk(ci)
		}
		pi := (s >> pageShift) & chunkMask
		c.p[pi] = &page{}
		c.owned[pi>>6] |= 1 << (pi & 63) // new: nobody shares it
	}
	x.nslots++
	return s
}

// holds reports whether w holds e.
func (e *entry) holds(w WorkerID) bool {
	if e.nholders == 0 {
		return false
	}
	if e.first.w == w {
		return true
	}
	for _, h := range e.more {
		if h.w == w {
			return true
		}
	}
	return false
}

// View is a frozen, read-only copy of an index as it was when Freeze
// returned. It may be read from any goroutine while the index goes on
// changing (under its owner's lock), and costs nothing until the index
// writes a page they share.
type View struct {
	chunks   []*chunk
	head     int32
	n        int
	views    *atomic.Int64
	released atomic.Bool
}

// Freeze returns a frozen view of the index. It copies only the chunk
// table (one pointer per 65,536 entries), so it is cheap enough to run
// under the routing lock whatever the size of the index; the writes that
// follow pay for copying the chunks and pages they touch, each at most
// once per view.
// Call Release on the view when done reading it.
func (x *Index) Freeze() *View {
	v := &View{chunks: slices.Clone(x.chunks), head: x.head, n: len(x.byHash), views: &x.cow.views}
	x.cow.gen++
	x.cow.views.Add(1)
	return v
}

// Len is the number of entries in the view.
func (v *View) Len() int { return v.n }

// ErrReleased is returned by a walk over a view after its Release.
var ErrReleased = errors.New("index: view already released")

// Walk is Index.Walk over the frozen view. After Release it visits nothing
// and returns ErrReleased: the pages may have been written since.
func (v *View) Walk(fn func(hash uint64, used int64, holders []Holder) bool) error {
	if v.released.Load() {
		return ErrReleased
	}
	walk(v.chunks, v.head, fn)
	return nil
}

// Release tells the index the view will not be read again, so pages it
// shared may be written in place. Calling it more than once is harmless.
func (v *View) Release() {
	if v.released.CompareAndSwap(false, true) {
		v.chunks = nil
		v.views.Add(-1)
	}
}

// walk visits the LRU list starting at head over chunks.
func walk(chunks []*chunk, head int32, fn func(hash uint64, used int64, holders []Holder) bool) {
	var buf []Holder
	for s := head; s != nilSlot; {
		e := &chunks[s>>slotsShift].p[(s>>pageShift)&chunkMask].e[s&pageMask]
		buf = buf[:0]
		buf = append(buf, Holder{Worker: e.first.w, At: e.first.at})
		for _, h := range e.more {
			buf = append(buf, Holder{Worker: h.w, At: h.at})
		}
		if !fn(e.hash, e.used, buf) {
			return
		}
		s = e.next
	}
}
