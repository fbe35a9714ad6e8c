package index

import "math"

// WorkerID identifies a worker inside the index. IDs are assigned by the
// caller and must not be reused for a different worker while the index
// still holds entries for the old one (RemoveWorker first).
type WorkerID uint32

const nilSlot = -1

type holder struct {
	w  WorkerID
	at int64 // last time this worker was sent this prefix
}

type entry struct {
	hash       uint64
	prev, next int32 // LRU neighbours; head = most recently used
	used       int64 // last touch of any holder
	first      holder
	more       []holder // rare: shared prefixes such as system prompts
	nholders   int32
}

// Stats counts what the index did, for metrics.
type Stats struct {
	Entries        int
	Evicted        uint64 // entries removed by LRU eviction or expiry
	SkippedInserts uint64 // new entries not stored because the index was full
}

// Index is the prefix index. The zero value is not usable; call New.
type Index struct {
	// pages hold the slab, in fixed-size pages so that a frozen view (see
	// Freeze) can share them with the live index and only the pages
	// written after a freeze are copied (cow.go).
	pages  []*page
	nslots int32 // slots handed out so far, live or free
	// freeHead is the first free slot; free slots are chained through
	// their entries' next. Chained rather than a slice: a slice of a few
	// hundred thousand slots, grown while an undo or an eviction frees
	// them, stalled the lock holder for milliseconds per growth (fresh
	// pages to fault in).
	freeHead   int32
	byHash     table // hash -> slot (table.go)
	head, tail int32
	ceiling    int // never store more entries than this
	inline     bool
	presized   bool // Options.Presize: a reset keeps the table's array
	stats      Stats
	cow        cow
	// onRelease is told every (hash, worker) pair the index stops
	// recording, whatever the cause (see OnRelease).
	onRelease func(hash uint64, w WorkerID)
	// retired workers' holdings are purged in steps (RetireWorker,
	// PurgeStep); purgeAt is the next slot the purge looks at.
	retired map[WorkerID]struct{}
	purgeAt int32
	// The walk StartWalkUp began (walkup.go): upLast is the last entry it
	// visited, nilSlot before the first.
	upOn   bool
	upLast int32
	upBuf  []Holder
	// touchBuf holds TouchHeld's slots between its two passes.
	touchBuf []int32
	// warmSum keeps warm's loads from being optimized away; warmBuf holds
	// warmTail's hashes.
	warmSum uint64
	warmBuf []uint64
}

// Options bound the index.
type Options struct {
	// MaxEntries is the target size that Evict trims to.
	MaxEntries int
	// Headroom is how far above MaxEntries inserts may grow the index
	// between Evict passes; beyond MaxEntries+Headroom new entries are
	// skipped (and counted) instead of waiting for an eviction pass.
	Headroom int
	// InlineEvict makes a full index evict its least recently used entry to
	// make room for a new one instead of skipping it. Used when no periodic
	// eviction pass runs.
	InlineEvict bool
	// Presize allocates the hash table for MaxEntries+Headroom entries up
	// front (8 bytes a slot, 11-21 an entry, its pages mapped at once, see
	// prefault), so it never grows. Grown, the table doubles under an insert, which
	// allocates the new array (milliseconds at a million entries, see
	// table.grow), and moves its entries over the next inserts
	// (BenchmarkInsertWhileGrowing). After a reset, the table is the one
	// ResetTo is given (Reserve), which its caller allocates away from the
	// routing lock.
	Presize bool
}

// New returns an empty index.
func New(o Options) *Index {
	if o.MaxEntries < 1 {
		o.MaxEntries = 1
	}
	if o.Headroom < 0 || o.InlineEvict {
		o.Headroom = 0
	}
	size := 0
	if o.Presize {
		size = o.MaxEntries + o.Headroom
	}
	return &Index{
		byHash:   newTable(size),
		head:     nilSlot,
		tail:     nilSlot,
		ceiling:  o.MaxEntries + o.Headroom,
		inline:   o.InlineEvict,
		presized: o.Presize,
		upLast:   nilSlot,
		freeHead: nilSlot,
	}
}

// Stats returns counters and the current size.
func (x *Index) Stats() Stats {
	s := x.stats
	s.Entries = x.byHash.len()
	return s
}

// Len is the number of entries.
func (x *Index) Len() int { return x.byHash.len() }

// Ceiling is the most entries the index ever stores (MaxEntries plus the
// headroom allowed between eviction passes).
func (x *Index) Ceiling() int { return x.ceiling }

// OnRelease registers fn to be told of every (hash, worker) pair the index
// stops recording: LRU eviction, expiry, Clear, RemoveHolder and
// RemoveWorker. State kept beside the index per worker (the engine's cache
// models) follows the index with it instead of outgrowing it. fn must not
// call back into the index.
func (x *Index) OnRelease(fn func(hash uint64, w WorkerID)) { x.onRelease = fn }

// released reports every holder of slot s to onRelease.
func (x *Index) released(s int32) {
	e := x.at(s)
	if x.onRelease == nil || e.nholders == 0 {
		return
	}
	x.onRelease(e.hash, e.first.w)
	for _, h := range e.more {
		x.onRelease(e.hash, h.w)
	}
}

// Match is the result of a lookup: for each worker holding a block of the
// leading run of hashes present in the index, the number of leading blocks
// it holds. Hashes are chained, so holding block i means the worker was sent
// blocks 0..i, even if a withdrawn placement (RemoveHolder) has since taken
// it off a shallower one.
type Match struct {
	Workers []WorkerID
	Blocks  []int
	// Longest is the deepest matched block count over all workers.
	Longest int
}

// Reset empties m keeping its capacity.
func (m *Match) Reset() {
	m.Workers = m.Workers[:0]
	m.Blocks = m.Blocks[:0]
	m.Longest = 0
}

// BlocksFor returns how many leading blocks worker w holds (0 if none).
func (m *Match) BlocksFor(w WorkerID) int {
	for i, id := range m.Workers {
		if id == w {
			return m.Blocks[i]
		}
	}
	return 0
}

func (m *Match) set(w WorkerID, blocks int) {
	for i, id := range m.Workers {
		if id == w {
			m.Blocks[i] = blocks
			return
		}
	}
	m.Workers = append(m.Workers, w)
	m.Blocks = append(m.Blocks, blocks)
}

// Lookup finds, for every worker, the longest run of leading hashes it
// holds: the deepest block it holds before the first hash missing from the
// index (see Match). It does not change the index (a dry run may call it
// freely).
// m is reset first; with enough capacity in m, Lookup does not allocate.
func (x *Index) Lookup(hashes []uint64, m *Match) {
	x.LookupSince(hashes, math.MinInt64, m)
}

// LookupSince is Lookup counting only holders sent the prefix at or after
// since (a time-to-live: older placements are presumed evicted).
func (x *Index) LookupSince(hashes []uint64, since int64, m *Match) {
	m.Reset()
	for i, h := range hashes {
		if i%lookupWarm == 0 {
			// In steps: the walk stops at the first miss, and a new
			// prompt's blocks past it are not worth loading here.
			x.warm(hashes[i:min(i+lookupWarm, len(hashes))])
		}
		s, ok := x.find(h)
		if !ok {
			return
		}
		e := x.at(s)
		if e.nholders == 0 {
			return
		}
		if e.first.at >= since {
			m.set(e.first.w, i+1)
		}
		for _, hd := range e.more {
			if hd.at >= since {
				m.set(hd.w, i+1)
			}
		}
		m.Longest = i + 1
	}
}

// Insert records that worker w was sent the prefix hashes at time now:
// every block on the path gets w as a holder (or its time refreshed) and
// moves to the front of the LRU order. It returns how many new entries
// could not be stored because the index was full: the shallowest new
// blocks that fit are kept and the path is cut before the first that does
// not (with InlineEvict, the least recently used entries make room instead).
func (x *Index) Insert(hashes []uint64, w WorkerID, now int64) (skipped int) {
	if !x.inline && x.ceiling-x.byHash.len() < len(hashes) {
		// Not every new block may fit: keep the shallowest ones. A deeper
		// block stored without its parent could never be matched and would
		// only take the room of a reachable one.
		hashes, skipped = x.fit(hashes, x.ceiling-x.byHash.len())
	}
	x.warm(hashes)
	protected, tailWarm := false, false
	// Leaf first, root last, so ancestors are always more recent than
	// their descendants (see the package comment).
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		s, ok := x.find(h)
		if !ok {
			if x.byHash.len() >= x.ceiling {
				if !x.inline || x.tail == nilSlot {
					skipped++
					continue
				}
				if !protected {
					// The blocks of this path not yet touched may be
					// the LRU tail: move them out of the way first, or
					// they would be evicted and re-created, losing
					// their other holders.
					x.touchPrefix(hashes[:i])
					protected = true
				}
				if !tailWarm {
					// At most this block and the i shallower ones
					// evict.
					x.warmTail(i + 1)
					tailWarm = true
				}
				x.evictTail()
			}
			s = x.alloc(h)
		} else {
			x.unlink(s)
		}
		e := x.at(s)
		if x.shared() {
			e = x.mutShared(s)
		}
		e.used = now
		e.addHolder(w, now)
		x.pushFront(s)
	}
	x.stats.SkippedInserts += uint64(skipped)
	return skipped
}

// fit cuts hashes before the first new block that does not fit in room
// free entries, and returns the cut path and how many new blocks it left out.
func (x *Index) fit(hashes []uint64, room int) ([]uint64, int) {
	cut, left := len(hashes), 0
	for i, h := range hashes {
		if _, ok := x.find(h); ok {
			continue
		}
		if cut == len(hashes) {
			if room > 0 {
				room--
				continue
			}
			cut = i
		}
		left++
	}
	return hashes[:cut], left
}

// touchPrefix moves the leading run of hashes present in the index to the
// front of the LRU order, leaf first, without changing holders or times.
// (Entries past a missing hash cannot be matched, so they need no
// protection, and a miss costs a single lookup.)
func (x *Index) touchPrefix(hashes []uint64) {
	n := 0
	for n < len(hashes) {
		if _, ok := x.find(hashes[n]); !ok {
			break
		}
		n++
	}
	for i := n - 1; i >= 0; i-- {
		s, _ := x.find(hashes[i])
		x.unlink(s)
		x.pushFront(s)
	}
}

// RemoveHolder undoes a placement: worker w no longer counts as holding
// hashes (e.g. the request sent there failed before the worker saw it, so
// it must not leave a phantom holder). Entries left without holders are
// freed.
func (x *Index) RemoveHolder(hashes []uint64, w WorkerID) {
	for _, h := range hashes {
		s, ok := x.find(h)
		if !ok {
			continue
		}
		if !x.at(s).holds(w) {
			continue
		}
		e := x.mut(s)
		if e.removeHolder(w) && x.onRelease != nil {
			x.onRelease(h, w)
		}
		if e.nholders == 0 {
			x.drop(s)
		}
	}
}

// RetireWorker marks worker w gone for good in O(1): its holdings are
// dropped by later PurgeSteps, so removing a worker never holds its
// caller's lock for a pass over the index (RemoveWorker took 30-40 ms at a
// million entries). Until purged they still appear in Lookup's Match and in
// Walk, which is why w must never be used again: callers skip workers they
// no longer know (the engine and the snapshot writer do).
func (x *Index) RetireWorker(w WorkerID) {
	if x.retired == nil {
		x.retired = make(map[WorkerID]struct{})
	}
	x.retired[w] = struct{}{}
	x.purgeAt = 0 // a full pass from here covers w
}

// PurgeStep drops retired workers' holdings from at most limit slots and
// reports whether none are left (then the retired set is forgotten).
func (x *Index) PurgeStep(limit int) (done bool) {
	if len(x.retired) == 0 {
		return true
	}
	end := min(x.purgeAt+int32(max(1, limit)), x.nslots)
	for s := x.purgeAt; s < end; s++ {
		if e := x.at(s); e.nholders == 0 || !x.holdsRetired(e) {
			continue
		}
		e := x.mut(s)
		for w := range x.retired {
			if e.removeHolder(w) && x.onRelease != nil {
				x.onRelease(e.hash, w)
			}
		}
		if e.nholders == 0 {
			x.drop(s)
		}
	}
	x.purgeAt = end
	if end < x.nslots {
		return false
	}
	clear(x.retired)
	x.purgeAt = 0
	return true
}

func (x *Index) holdsRetired(e *entry) bool {
	if _, ok := x.retired[e.first.w]; ok {
		return true
	}
	for _, h := range e.more {
		if _, ok := x.retired[h.w]; ok {
			return true
		}
	}
	return false
}

// Retiring reports how many retired workers still have holdings to purge.
func (x *Index) Retiring() int { return len(x.retired) }

// RemoveWorker forgets everything worker w holds at once. O(entries): the
// engine retires workers instead (removed ones, and cleared ones under a
// fresh id); this is the reference RetireWorker's purge is tested against.
func (x *Index) RemoveWorker(w WorkerID) {
	for s := x.head; s != nilSlot; {
		next := x.at(s).next
		if !x.at(s).holds(w) {
			s = next
			continue
		}
		e := x.mut(s)
		if e.removeHolder(w) && x.onRelease != nil {
			x.onRelease(e.hash, w)
		}
		if e.nholders == 0 {
			x.drop(s)
		}
		s = next
	}
}

// Evict removes least recently used entries until at most target remain,
// but no more than limit entries per call (limit <= 0: no limit), so a
// caller can trim a large index in short steps. It reports how many it
// removed and whether the index is now at or below target.
func (x *Index) Evict(target, limit int) (removed int, done bool) {
	for x.byHash.len() > target && x.tail != nilSlot {
		if limit > 0 && removed >= limit {
			return removed, false
		}
		if removed%warmBatch == 0 {
			n := x.byHash.len() - target
			if limit > 0 {
				n = min(n, limit-removed)
			}
			x.warmTail(n)
		}
		x.evictTail()
		removed++
	}
	return removed, true
}

// ExpireBefore removes every entry not touched since cutoff, up to limit
// entries per call (limit <= 0: no limit). The LRU order is also the
// touch-time order, so this walks from the tail and stops at the first
// fresh entry.
func (x *Index) ExpireBefore(cutoff int64, limit int) (removed int, done bool) {
	for x.tail != nilSlot && x.at(x.tail).used < cutoff {
		if limit > 0 && removed >= limit {
			return removed, false
		}
		x.evictTail()
		removed++
	}
	return removed, true
}

// Clear drops every entry, reporting each release: O(entries) with a
// release hook.
func (x *Index) Clear() {
	if x.onRelease != nil {
		for s := x.head; s != nilSlot; s = x.at(s).next {
			x.released(s)
		}
	}
	x.Reset()
}

// Reserved is an empty hash table allocated ahead of a reset (Reserve),
// away from the routing lock: zeroing a table sized for a million entries
// takes milliseconds. ResetTo takes it: a Reserved serves one reset.
type Reserved struct{ t table }

// Reserve allocates room for n entries, for ResetTo.
func Reserve(n int) *Reserved { return &Reserved{t: newTable(n)} }

// Reset drops every entry without reporting releases, for a caller that
// resets what it keeps beside the index itself: O(pages), the entries
// are left to the garbage collector (the daily reset of a million entries
// must not hold the routing lock for a pass over them).
func (x *Index) Reset() { x.ResetTo(nil) }

// ResetTo is Reset taking r's table for the empty index: refilled, it does
// not grow under the inserts (see Options.Presize). When r is nil or was
// taken already, a presized index empties its own table in place (a
// memory clear, where a new array would be allocated and faulted in
// again) and any other starts a fresh, growing one.
func (x *Index) ResetTo(r *Reserved) {
	x.stats.Evicted += uint64(x.byHash.len())
	switch {
	case r != nil && r.t.slots != nil:
		x.byHash, r.t = r.t, table{}
	case x.presized:
		x.byHash.empty()
	default:
		x.byHash = newTable(0)
	}
	// Pages may be shared with frozen views: drop them rather than reuse.
	clear(x.pages)
	x.pages = x.pages[:0]
	clear(x.cow.owned)
	x.cow.owned = x.cow.owned[:0]
	x.nslots = 0
	x.freeHead = nilSlot
	x.head, x.tail = nilSlot, nilSlot
	clear(x.retired)
	x.purgeAt = 0
	x.endWalkUp()
}

// Walk calls fn for every entry from most to least recently used, with its
// hash and holders (valid only during the call). It is for snapshots and
// diagnostics, not the routing path.
func (x *Index) Walk(fn func(hash uint64, used int64, holders []Holder) bool) {
	walk(x.pages, x.head, fn)
}

// Holder is a worker that was sent a prefix and when.
type Holder struct {
	Worker WorkerID
	At     int64
}

// Holders returns the holders of a single block hash (nil if absent).
func (x *Index) Holders(hash uint64) []Holder {
	s, ok := x.find(hash)
	if !ok {
		return nil
	}
	return x.at(s).appendHolders(nil)
}

// appendHolders appends e's holders to dst.
func (e *entry) appendHolders(dst []Holder) []Holder {
	dst = append(dst, Holder{Worker: e.first.w, At: e.first.at})
	for _, h := range e.more {
		dst = append(dst, Holder{Worker: h.w, At: h.at})
	}
	return dst
}

func (x *Index) evictTail() {
	x.released(x.tail)
	x.drop(x.tail)
	x.stats.Evicted++
}

func (x *Index) alloc(h uint64) int32 {
	var s int32
	if x.freeHead != nilSlot {
		s = x.freeHead
		x.freeHead = x.at(s).next
	} else {
		s = x.grow()
	}
	*x.mut(s) = entry{hash: h, prev: nilSlot, next: nilSlot}
	x.byHash.insert(h, s)
	return s
}

func (x *Index) drop(s int32) {
	x.unlink(s)
	e := x.at(s)
	if x.shared() {
		e = x.mutShared(s)
	}
	x.byHash.remove(e.hash, s)
	*e = entry{prev: nilSlot, next: x.freeHead}
	x.freeHead = s
}

// unlink and pushFront run for every block a decision touches, so they
// test for a frozen view once and call mutShared only then, instead of
// calling mut (too large to inline) per slot.
func (x *Index) unlink(s int32) {
	shared := x.shared()
	e := x.at(s)
	if s == x.upLast {
		// Keep the walk's visited run contiguous (walkup.go).
		x.upLast = e.next
	}
	if shared {
		e = x.mutShared(s)
	}
	if e.prev != nilSlot {
		p := x.at(e.prev)
		if shared {
			p = x.mutShared(e.prev)
		}
		p.next = e.next
	} else if x.head == s {
		x.head = e.next
	}
	if e.next != nilSlot {
		n := x.at(e.next)
		if shared {
			n = x.mutShared(e.next)
		}
		n.prev = e.prev
	} else if x.tail == s {
		x.tail = e.prev
	}
	e.prev, e.next = nilSlot, nilSlot
}

func (x *Index) pushFront(s int32) {
	shared := x.shared()
	e := x.at(s)
	if shared {
		e = x.mutShared(s)
	}
	e.prev = nilSlot
	e.next = x.head
	if x.head != nilSlot {
		h := x.at(x.head)
		if shared {
			h = x.mutShared(x.head)
		}
		h.prev = s
	}
	x.head = s
	if x.tail == nilSlot {
		x.tail = s
	}
}

func (e *entry) addHolder(w WorkerID, now int64) {
	if e.nholders == 0 {
		e.first = holder{w: w, at: now}
		e.nholders = 1
		return
	}
	if e.first.w == w {
		e.first.at = now
		return
	}
	for i := range e.more {
		if e.more[i].w == w {
			e.more[i].at = now
			return
		}
	}
	e.more = append(e.more, holder{w: w, at: now})
	e.nholders++
}

// removeHolder drops w from e and reports whether it was a holder.
func (e *entry) removeHolder(w WorkerID) bool {
	if e.nholders == 0 {
		return false
	}
	if e.first.w == w {
		if len(e.more) == 0 {
			e.first = holder{}
			e.nholders = 0
			return true
		}
		last := len(e.more) - 1
		e.first = e.more[last]
		e.more = e.more[:last]
		e.nholders--
		return true
	}
	for i := range e.more {
		if e.more[i].w == w {
			last := len(e.more) - 1
			e.more[i] = e.more[last]
			e.more = e.more[:last]
			e.nholders--
			return true
		}
	}
	return false
}

// HeldPrefix is how many of hashes, from the first, w holds without a gap.
func (x *Index) HeldPrefix(hashes []uint64, w WorkerID) int {
	n := 0
	for n < len(hashes) {
		if _, ok := x.HolderAt(hashes[n], w); !ok {
			break
		}
		n++
	}
	return n
}

// TouchHeld refreshes, to now, the leading blocks of hashes that w holds
// without a gap, and returns how many: HeldPrefix then Insert of that
// prefix (same times, same LRU order), but with one table lookup per block
// instead of two, and never adding an entry or a holder.
func (x *Index) TouchHeld(hashes []uint64, w WorkerID, now int64) int {
	slots := x.touchBuf[:0]
	for _, h := range hashes {
		s, ok := x.find(h)
		if !ok || !x.at(s).holds(w) {
			break
		}
		slots = append(slots, s)
	}
	// Leaf first, root last, as Insert does (see the package comment).
	for i := len(slots) - 1; i >= 0; i-- {
		s := slots[i]
		x.unlink(s)
		e := x.mut(s)
		e.used = now
		e.addHolder(w, now)
		x.pushFront(s)
	}
	x.touchBuf = slots
	return len(slots)
}

// warm loads the table word at each hash's home before the hashes are
// looked up one by one. The loads do not depend on each other, so the
// processor has several cache misses in flight at once; the lookups that
// follow, each waiting for its own load before the next can start, then
// find their words in cache.
func (x *Index) warm(hashes []uint64) {
	t := &x.byHash
	a := t.slots
	mask := uint64(len(a) - 1)
	var sum uint64
	for _, h := range hashes {
		sum += a[(t.mix(h)>>t.shift)&mask]
	}
	x.warmSum = sum
}

// lookupWarm is how many hashes ahead LookupSince warms.
const lookupWarm = 32

// warmBatch is how many of the LRU tail's entries warmTail prepares at a
// time.
const warmBatch = 128

// warmTail warms the table words of the next min(n, warmBatch) entries an
// eviction will remove. Walking the tail reads each entry anyway (a chain
// of dependent misses); the table words they lead to are independent of
// each other and of the walk.
func (x *Index) warmTail(n int) {
	if n < 2 {
		return
	}
	buf := x.warmBuf[:0]
	for s := x.tail; s != nilSlot && len(buf) < min(n, warmBatch); s = x.at(s).prev {
		buf = append(buf, x.at(s).hash)
	}
	x.warmBuf = buf
	x.warm(buf)
}

// find returns the slot of hash h: the table's candidate whose slab entry
// has the hash (see table). The walk over the run is table.next's written
// out: through the cursor, a call per candidate, it cost twice as much at
// 10k entries and 30% more at 1M (BenchmarkTable's hit and miss).
func (x *Index) find(h uint64) (int32, bool) {
	t := &x.byHash
	m := t.mix(h)
	a, fp := t.slots, m>>32
	mask := uint64(len(a) - 1)
	for i := m >> t.shift; ; i++ {
		w := a[i&mask]
		if w == 0 {
			break
		}
		if w>>32 == fp {
			if s := int32(uint32(w)) - 1; x.at(s).hash == h {
				return s, true
			}
		}
	}
	if t.old == nil {
		return nilSlot, false
	}
	return x.findOld(h, m)
}

// findOld is the rest of find while the table grows: the old array.
func (x *Index) findOld(h, m uint64) (int32, bool) {
	c := cursor{m: m, pos: m >> (x.byHash.shift + 1), old: true}
	for {
		s, ok := x.byHash.next(&c)
		if !ok {
			return nilSlot, false
		}
		if x.at(s).hash == h {
			return s, true
		}
	}
}

// HolderAt returns when worker w was last sent the block hash, without
// allocating.
func (x *Index) HolderAt(hash uint64, w WorkerID) (int64, bool) {
	s, ok := x.find(hash)
	if !ok {
		return 0, false
	}
	e := x.at(s)
	if e.nholders > 0 && e.first.w == w {
		return e.first.at, true
	}
	for _, h := range e.more {
		if h.w == w {
			return h.at, true
		}
	}
	return 0, false
}
