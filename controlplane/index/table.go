package index

import (
	"math"
	"math/bits"
	"math/rand/v2"
)

// table maps a block hash to its slab slot: a flat open-addressing hash
// table with linear probing, in place of a Go map, which profiles of the
// control plane at 5,000 routes/s showed at 12% of the leader's CPU and
// 23% of a follower's (issue 13).
//
// A slot is one uint64: the top 32 bits of the key's mixed hash (its
// fingerprint) over the slab slot + 1 (so 0 is an empty slot). The table
// does not keep the key itself: a fingerprint match is a candidate that
// the caller confirms against the slab entry's hash, which it reads anyway
// on a hit (Index.find). Half the size of key+value slots, eight to a cache
// line, and deleting by slab slot needs no key compare at all. Measured
// against 16-byte key+value slots (BenchmarkTable, 1M entries, median of 5,
// ns): hit 110 vs 88 (the wide slot confirms without the slab read; the
// index does that read right after anyway), miss 54 vs 60, delete 65 vs
// 75, churn (delete + insert, the full index's steady state) 154 vs 183,
// and 16 MB vs 32 MB for a presized 1M-entry index; the Go map: 145, 67,
// 141, 262.
//
// The position is the top bits of the mixed hash too, so a slot's home is
// w >> shift, read off the word alone: backward-shift deletion and growth
// never touch the slab (no cache miss per moved slot), and growth keeps the
// seed. That caps the table at 2^32 slots, beyond any int32 slab.
//
// Deletion shifts the following entries of the run back (no tombstones),
// so probe runs stay as short as the load allows however long the index
// churns.
type table struct {
	slots []uint64
	shift uint // 64 - log2(len(slots))
	n     int  // entries, in slots and old
	limit int  // most entries slots holds before it grows
	// k0, k1 key the mix (see mix).
	k0, k1 uint64

	// While growing (see grow): old is the previous array, whose entries
	// move to slots a run at a time; migPos is the next position of old to
	// visit, migLeft how many are left.
	old     []uint64
	migPos  uint64
	migLeft int
	step    int // migrateStep; tests lower it to keep both arrays in use
}

const (
	tableMinSlots = 8
	// A table holds at most 3/4 of its slots: probe runs, which a miss
	// scans to the end, lengthen steeply with the load. BenchmarkTableLoad
	// at 2^21 slots, ns per lookup (hit / miss, 3 runs, a shared 2-core box,
	// through an earlier lookup with a call per candidate; the ratios hold):
	// 7/16 full 90 / 95, 0.6 full 105 / 150, 3/4 full 125 / 235, 7/8 full
	// 160 / 236-1278. Every new block's Insert starts with a miss, so 7/8
	// is too full; 1/2 would double a presized control plane's table (2^22
	// slots, 32 MB, for the default 1M entries + 1/8 headroom) for its
	// 1.18M. At 3/4 that ceiling fits in 2^21 slots (16 MB, 56% full), and
	// a growing table is 3/8 to 3/4 full: 11-21 bytes an entry, against
	// about 20 for the map.
	maxLoadNum, maxLoadDen = 3, 4
	// migrateStep is how many slots of the old array an insert or delete
	// moves while the table grows (finishing the run it is in, so that
	// every unvisited run stays whole). Growth starts at 3/4 of the old
	// size and the new array is full again only after as many inserts
	// again, so migration is done long before: old has len/64 steps.
	migrateStep = 64
	// maxTableSlots keeps a slot's home inside its 32-bit fingerprint.
	maxTableSlots = 1 << 32
)

// slotsFor is the power-of-two array that holds n entries without growing.
func slotsFor(n int) int {
	n = min(max(n, 0), math.MaxInt32)
	size := tableMinSlots
	for size/maxLoadDen*maxLoadNum < n && size < maxTableSlots {
		size *= 2
	}
	return size
}

// newTable returns an empty table with room for n entries.
//
// The seed is random per table because the keys are not secret: block
// hashes are unseeded xxhash of prompt text, and a client may even send
// the hashes themselves (RouteRequest.block_hashes). With a fixed mix a
// client could search offline for prompts whose blocks share a home and
// build probe runs thousands of slots long, turning every lookup on the
// routing lock into a scan. With a secret key it cannot predict where its
// blocks land, so runs stay as long as chance makes them.
func newTable(n int) table {
	t := table{k0: rand.Uint64(), k1: rand.Uint64() | 1, step: migrateStep}
	t.setSlots(make([]uint64, slotsFor(n)))
	if n > 0 {
		prefault(t.slots)
	}
	return t
}

// prefault writes a word of every page of a, so that the kernel maps the
// pages now rather than on the inserts' first writes. A table sized up
// front (Presize, Reserve) is made off the routing lock, and empty is
// zero, so its fresh pages would otherwise fault in under the lock, a few
// per insert, until random inserts have touched them all: 4,096 faults
// for 2^21 slots (BenchmarkInsertWhileGrowing presize=true, slowest
// insert: 1.3-2.4 ms without, 0.9-1.2 ms with, 3 runs each). A Go map
// sized up front sets its empty marks at make.
func prefault(a []uint64) {
	const wordsPerPage = 4096 / 8
	for i := 0; i < len(a); i += wordsPerPage {
		a[i] = 0
	}
}

func (t *table) setSlots(s []uint64) {
	t.slots = s
	t.shift = uint(64 - bits.TrailingZeros64(uint64(len(s))))
	t.limit = len(s) / maxLoadDen * maxLoadNum
}

// mix is a keyed folded multiply (the 128-bit product of the key, xored
// with k0, by the odd k1, high half xor low half): one multiplication that
// spreads every key bit over the high bits the position and fingerprint
// come from, unpredictably without k0 and k1.
func (t *table) mix(h uint64) uint64 {
	hi, lo := bits.Mul64(h^t.k0, t.k1)
	return hi ^ lo
}

func (t *table) len() int { return t.n }

// empty removes every entry and keeps the array (and the seed).
func (t *table) empty() {
	clear(t.slots)
	t.n, t.old, t.migLeft = 0, nil, 0
}

// cursor walks the candidates for one key: the slots of its probe run whose
// fingerprint matches, in slots then (while growing) in old.
type cursor struct {
	m   uint64 // the key's mixed hash
	pos uint64
	old bool // walking old
}

// probe starts the walk over key h's candidates.
func (t *table) probe(h uint64) cursor {
	m := t.mix(h)
	return cursor{m: m, pos: m >> t.shift}
}

// next returns the next candidate's value, or false when there are no
// more. The caller compares the candidate's key and calls next again on a
// mismatch (a fingerprint collision, rare: the top log2(len) of the 32
// bits are the home, and two keys of one home share the bits below it
// with odds 2^-(32-log2(len))).
func (t *table) next(c *cursor) (int32, bool) {
	a := t.slots
	if c.old {
		a = t.old
	}
	mask := uint64(len(a) - 1)
	fp := c.m >> 32
	for i := c.pos; ; i++ {
		w := a[i&mask]
		if w == 0 {
			break
		}
		if w>>32 == fp {
			c.pos = i + 1
			return int32(uint32(w)) - 1, true
		}
	}
	if c.old || t.old == nil {
		return 0, false
	}
	// Growing: what is not in slots yet is in old.
	c.old, c.pos = true, c.m>>(t.shift+1)
	return t.next(c)
}

// insert adds key h with value v. The key must not be in the table (the
// caller looked it up first). v must be >= 0.
func (t *table) insert(h uint64, v int32) {
	if t.n >= t.limit {
		t.grow()
	}
	t.migrate()
	m := t.mix(h)
	place(t.slots, t.shift, m&^math.MaxUint32|uint64(uint32(v)+1))
	t.n++
}

// place puts w in the first free slot of its run in a.
func place(a []uint64, shift uint, w uint64) {
	mask := uint64(len(a) - 1)
	i := w >> shift
	for a[i&mask] != 0 {
		i++
	}
	a[i&mask] = w
}

// remove deletes key h, which has value v; false if it is not there.
func (t *table) remove(h uint64, v int32) bool {
	m := t.mix(h)
	w := m&^math.MaxUint32 | uint64(uint32(v)+1)
	ok := removeWord(t.slots, t.shift, w) || t.old != nil && removeWord(t.old, t.shift+1, w)
	if ok {
		t.n--
		t.migrate()
	}
	return ok
}

// removeWord deletes w from a and shifts back the rest of its run: each
// later entry moves into the hole if the hole lies between its home and
// where it is, so no entry ends up past an empty slot from its home.
func removeWord(a []uint64, shift uint, w uint64) bool {
	mask := uint64(len(a) - 1)
	i := (w >> shift) & mask
	for a[i] != w {
		if a[i] == 0 {
			return false
		}
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		x := a[j]
		if x == 0 {
			break
		}
		// Distances along the probe order, wrapping past the end.
		if (j-x>>shift)&mask >= (j-i)&mask {
			a[i] = x
			i = j
		}
	}
	a[i] = 0
	return true
}

// grow doubles the array. Rehashing every entry in the insert that
// doubles it held the caller 65-90 ms on the way to 1M entries
// (BenchmarkTableGrow at-once), so the entries move a few runs per insert
// and delete (migrate) while lookups look in both arrays. What is left in
// one operation is the new array's allocation: 16 MB on the way to 1M
// entries, 0.4-1.8 ms of CPU alone on the shared 2-core box, and up to
// ~12 ms when the allocation pays a GC assist (BenchmarkTableGrow
// incremental cpu-grow-max-µs 2.3-12.5 ms in two runs, against 1.6-3.2 ms
// for the slowest map insert: a Go map grows in small tables). So a table
// behind a latency-bound lock is sized up front: presized tables
// (Options.Presize, Reserve) never grow.
func (t *table) grow() {
	if t.old != nil {
		// Not reached with migrateStep > 4/3: finish the last growth.
		t.migrateN(math.MaxInt)
	}
	if len(t.slots) >= maxTableSlots {
		// An int32 slab never gets here; overload rather than fail.
		t.limit = math.MaxInt
		return
	}
	old := t.slots
	t.setSlots(make([]uint64, 2*len(old)))
	t.old = old
	// Start the visit at an empty slot: moving whole runs from there, the
	// runs not yet visited are whole, and a run never wraps past it.
	t.migPos = 0
	for old[t.migPos] != 0 {
		t.migPos++
	}
	t.migLeft = len(old)
}

func (t *table) migrate() {
	if t.old != nil {
		t.migrateN(t.step)
	}
}

// migrateN moves the entries of at least n slots of old to slots, and on
// to the end of the run it stops in: the visited slots are all empty, the
// unvisited runs untouched, so a lookup in old still finds what is left.
// Deleting from old keeps that true: a backward shift moves an entry only
// within its run.
func (t *table) migrateN(n int) {
	old := t.old
	mask := uint64(len(old) - 1)
	for ; t.migLeft > 0; t.migLeft-- {
		w := old[t.migPos]
		if w == 0 && n <= 0 {
			break
		}
		if w != 0 {
			place(t.slots, t.shift, w)
			old[t.migPos] = 0
		}
		t.migPos = (t.migPos + 1) & mask
		n--
	}
	if t.migLeft == 0 {
		t.old = nil
	}
}
