package index

import (
	"errors"
	"slices"
	"sync/atomic"
)

// The slab is cut into pages of pageSize entries so that a snapshot can
// freeze the index by copying the page table (one pointer per 64 entries:
// 128 KB, some tens of microseconds, at a million entries) instead of
// every entry under the routing lock. While a frozen view is alive, the
// first write to a page copies it (copy on write); what nobody writes stays
// shared. A page is small so that one decision, which writes a few slots
// (its path and their LRU neighbours), copies little: 64 entries are about
// 4.6 KB. The table is flat, not a tree of chunks, because every slot
// access on the routing path pays for each level.
const (
	pageShift = 6
	pageSize  = 1 << pageShift
	pageMask  = pageSize - 1
)

type page struct {
	e [pageSize]entry
}

// cow is the copy-on-write bookkeeping.
type cow struct {
	// owned marks the pages written since the last Freeze (copied, or
	// new): the others may be shared with a frozen view.
	owned []uint64
	// views counts frozen views not yet released. With none, everything
	// is written in place: nobody else reads it (Release comes after a
	// view's last read). Atomic because a view is released by whoever
	// wrote it out, outside the routing lock.
	views atomic.Int64
}

// at returns slot s for reading only.
func (x *Index) at(s int32) *entry { return &x.pages[s>>pageShift].e[s&pageMask] }

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
	pi := s >> pageShift
	if x.cow.owned[pi>>6]&(1<<(pi&63)) == 0 {
		np := new(page)
		*np = *x.pages[pi]
		for j := range np.e {
			// Holder lists are written in place (times refreshed,
			// holders swapped out), so the copy gets its own.
			if m := np.e[j].more; m != nil {
				np.e[j].more = slices.Clone(m)
			}
		}
		x.pages[pi] = np
		x.cow.owned[pi>>6] |= 1 << (pi & 63)
	}
	return &x.pages[pi].e[s&pageMask]
}

// grow hands out a never-used slot, adding a page when the last is full.
func (x *Index) grow() int32 {
	s := x.nslots
	if s&pageMask == 0 {
		pi := int(s >> pageShift)
		x.pages = append(x.pages, &page{})
		if pi>>6 == len(x.cow.owned) {
			x.cow.owned = append(x.cow.owned, 0)
		}
		x.cow.owned[pi>>6] |= 1 << (pi & 63) // new: nobody shares it
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
	pages    []*page
	head     int32
	n        int
	views    *atomic.Int64
	released atomic.Bool
}

// Freeze returns a frozen view of the index. It copies only the page
// table, so it is cheap enough to run under the routing lock; the writes
// that follow pay for copying the pages they touch, each at most once per
// view. Call Release on the view when done reading it.
func (x *Index) Freeze() *View {
	v := &View{pages: slices.Clone(x.pages), head: x.head, n: x.byHash.len(), views: &x.cow.views}
	clear(x.cow.owned)
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
	walk(v.pages, v.head, fn)
	return nil
}

// Release tells the index the view will not be read again, so pages it
// shared may be written in place. Calling it more than once is harmless.
func (v *View) Release() {
	if v.released.CompareAndSwap(false, true) {
		v.pages = nil
		v.views.Add(-1)
	}
}

// walk visits the LRU list starting at head over pages.
func walk(pages []*page, head int32, fn func(hash uint64, used int64, holders []Holder) bool) {
	var buf []Holder
	for s := head; s != nilSlot; {
		e := &pages[s>>pageShift].e[s&pageMask]
		buf = e.appendHolders(buf[:0])
		if !fn(e.hash, e.used, buf) {
			return
		}
		s = e.next
	}
}
