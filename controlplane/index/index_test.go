package index

import (
	"maps"
	"runtime"
	"slices"
	"strings"
	"testing"
)

func TestNewOptions(t *testing.T) {
	tests := []struct {
		name string
		o    Options
		want int // ceiling
	}{
		{"zero", Options{}, 1},
		{"negative", Options{MaxEntries: -5, Headroom: -3}, 1},
		{"headroom", Options{MaxEntries: 10, Headroom: 5}, 15},
		{"negative headroom", Options{MaxEntries: 10, Headroom: -5}, 10},
		{"inline ignores headroom", Options{MaxEntries: 10, Headroom: 5, InlineEvict: true}, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := New(tt.o)
			if x.ceiling != tt.want {
				t.Errorf("ceiling=%d want %d", x.ceiling, tt.want)
			}
			if x.Len() != 0 || x.Stats() != (Stats{}) {
				t.Errorf("new index not empty: %+v", x.Stats())
			}
			checkInvariants(t, x)
		})
	}
}

func TestLookup(t *testing.T) {
	const bc = 2
	path := hashes("aabbccddee", bc) // 5 blocks
	other := hashes("zzbbccddee", bc)

	type ins struct {
		path []uint64
		w    WorkerID
	}
	tests := []struct {
		name    string
		inserts []ins
		query   []uint64
		want    map[WorkerID]int
		longest int
	}{
		{"empty index", nil, path, map[WorkerID]int{}, 0},
		{"empty query", []ins{{path, 1}}, nil, map[WorkerID]int{}, 0},
		{"full match", []ins{{path, 1}}, path, map[WorkerID]int{1: 5}, 5},
		{"query longer than held", []ins{{path[:2], 1}}, path, map[WorkerID]int{1: 2}, 2},
		{"query shorter than held", []ins{{path, 1}}, path[:3], map[WorkerID]int{1: 3}, 3},
		{"first block differs", []ins{{path, 1}}, other, map[WorkerID]int{}, 0},
		{"longest run per worker", []ins{{path[:1], 1}, {path[:3], 2}, {path, 3}}, path,
			map[WorkerID]int{1: 1, 2: 3, 3: 5}, 5},
		{"several holders of the same prefix", []ins{{path[:4], 1}, {path[:4], 2}, {path[:4], 7}}, path,
			map[WorkerID]int{1: 4, 2: 4, 7: 4}, 4},
		{"divergent branch does not count", []ins{{path, 1}, {hashes("aabbXXddee", bc), 2}}, path,
			map[WorkerID]int{1: 5, 2: 2}, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := New(Options{MaxEntries: 100})
			for i, in := range tt.inserts {
				x.Insert(in.path, in.w, int64(i))
			}
			checkInvariants(t, x)
			before := lruOrder(x)
			var m Match
			x.Lookup(tt.query, &m)
			if got := matchMap(t, &m); !maps.Equal(got, tt.want) {
				t.Errorf("Lookup = %v, want %v", got, tt.want)
			}
			if m.Longest != tt.longest {
				t.Errorf("Longest = %d, want %d", m.Longest, tt.longest)
			}
			for w, b := range tt.want {
				if got := m.BlocksFor(w); got != b {
					t.Errorf("BlocksFor(%d)=%d want %d", w, got, b)
				}
			}
			if got := m.BlocksFor(99); got != 0 {
				t.Errorf("BlocksFor(absent)=%d", got)
			}
			if !slices.Equal(before, lruOrder(x)) {
				t.Error("Lookup changed the LRU order")
			}
		})
	}
}

// Lookup reports, per worker, the deepest block it holds within the run of
// leading hashes present in the index. Hashes are chained, so holding block
// i means the worker was sent all of blocks 0..i even if a withdrawn
// placement (RemoveHolder) took it off a shallower block since.
func TestLookupAfterRemoveHolderGap(t *testing.T) {
	path := hashes("aabbccdd", 2)
	x := New(Options{MaxEntries: 100})
	x.Insert(path, 1, 1)
	x.Insert(path[:3], 2, 2)
	x.RemoveHolder(path[1:3], 1) // worker 1 keeps blocks 0 and 3
	checkInvariants(t, x)
	var m Match
	x.Lookup(path, &m)
	if got, want := matchMap(t, &m), map[WorkerID]int{1: 4, 2: 3}; !maps.Equal(got, want) {
		t.Errorf("Lookup = %v, want %v", got, want)
	}
	// Without any holder, block 1 is gone and nothing past it matches.
	x.RemoveHolder(path[1:2], 2)
	x.Lookup(path, &m)
	if got, want := matchMap(t, &m), map[WorkerID]int{1: 1, 2: 1}; !maps.Equal(got, want) || m.Longest != 1 {
		t.Errorf("Lookup = %v longest %d, want %v longest 1", got, m.Longest, want)
	}
}

func TestMatchReuse(t *testing.T) {
	x := New(Options{MaxEntries: 100})
	p := hashes("aabbcc", 2)
	x.Insert(p, 1, 1)
	x.Insert(p, 2, 1)
	var m Match
	x.Lookup(p, &m)
	x.Lookup(hashes("zz", 2), &m)
	if len(m.Workers) != 0 || len(m.Blocks) != 0 || m.Longest != 0 {
		t.Errorf("Match not reset: %+v", m)
	}
}

func TestLookupAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	x := New(Options{MaxEntries: 10_000})
	p := Hash(nil, "m", []byte(strings.Repeat("abcdefgh", 1250)), 128)
	for w := range WorkerID(8) {
		x.Insert(p[:len(p)-int(w)], w, 1)
	}
	var m Match
	x.Lookup(p, &m) // grow m once
	if n := testing.AllocsPerRun(200, func() { x.Lookup(p, &m) }); n != 0 {
		t.Errorf("Lookup allocates %v times per call", n)
	}
	if m.Longest != len(p) || len(m.Workers) != 8 {
		t.Errorf("unexpected match %+v", m)
	}
}

func TestInsertRefresh(t *testing.T) {
	a := hashes("aabbcc", 2)
	b := hashes("xxyy", 2)
	x := New(Options{MaxEntries: 100})
	if n := x.Insert(a, 1, 10); n != 0 {
		t.Fatalf("skipped %d", n)
	}
	x.Insert(b, 1, 20)
	x.Insert(a[:2], 2, 25)
	if x.Len() != 5 {
		t.Fatalf("Len=%d want 5", x.Len())
	}
	// Re-inserting the same path adds no entry, refreshes times and
	// moves the path to the front of the LRU order, root first.
	x.Insert(a, 1, 30)
	checkInvariants(t, x)
	if x.Len() != 5 {
		t.Errorf("refresh changed Len to %d", x.Len())
	}
	want := []uint64{a[0], a[1], a[2], b[0], b[1]}
	if got := lruOrder(x); !slices.Equal(got, want) {
		t.Errorf("LRU order %#x want %#x", got, want)
	}
	if got := holderMap(x.Holders(a[0])); !maps.Equal(got, map[WorkerID]int64{1: 30, 2: 25}) {
		t.Errorf("holders of a0: %v", got)
	}
	if got := holderMap(x.Holders(a[2])); !maps.Equal(got, map[WorkerID]int64{1: 30}) {
		t.Errorf("holders of a2: %v", got)
	}
	if got := holderMap(x.Holders(b[1])); !maps.Equal(got, map[WorkerID]int64{1: 20}) {
		t.Errorf("holders of b1: %v", got)
	}
	var used []int64
	x.Walk(func(_ uint64, u int64, _ []Holder) bool { used = append(used, u); return true })
	if !slices.Equal(used, []int64{30, 30, 30, 20, 20}) {
		t.Errorf("used times %v", used)
	}
	if x.Holders(12345) != nil {
		t.Error("Holders of an absent hash is not nil")
	}
}

func TestWalk(t *testing.T) {
	x := New(Options{MaxEntries: 100})
	p := hashes("aabbcc", 2)
	x.Insert(p, 3, 1)
	x.Insert(p[:1], 4, 2)
	var got []uint64
	var hs [][]Holder
	x.Walk(func(h uint64, _ int64, holders []Holder) bool {
		got = append(got, h)
		hs = append(hs, slices.Clone(holders))
		return true
	})
	if !slices.Equal(got, p) {
		t.Errorf("Walk order %#x want %#x", got, p)
	}
	if len(hs[0]) != 2 || len(hs[1]) != 1 {
		t.Errorf("Walk holders %v", hs)
	}
	n := 0
	x.Walk(func(uint64, int64, []Holder) bool { n++; return false })
	if n != 1 {
		t.Errorf("Walk did not stop: %d calls", n)
	}
}

func TestEvict(t *testing.T) {
	x := New(Options{MaxEntries: 100})
	var all [][]uint64
	for i := range 10 {
		p := hashes(strings.Repeat(string(rune('a'+i)), 6), 2) // 3 blocks each
		all = append(all, p)
		x.Insert(p, WorkerID(i), int64(i))
	}
	if x.Len() != 30 {
		t.Fatalf("Len=%d", x.Len())
	}
	steps := []struct {
		target, limit int
		removed       int
		done          bool
		len           int
	}{
		{40, 0, 0, true, 30},  // already below target
		{30, 5, 0, true, 30},  // exactly at target
		{20, 4, 4, false, 26}, // limited step
		{20, 4, 4, false, 22},
		{20, 4, 2, true, 20},
		{20, 4, 0, true, 20},
		{5, 0, 15, true, 5}, // unlimited
		{-1, -1, 5, true, 0},
		{0, 0, 0, true, 0}, // empty index
	}
	for i, s := range steps {
		removed, done := x.Evict(s.target, s.limit)
		if removed != s.removed || done != s.done || x.Len() != s.len {
			t.Fatalf("step %d Evict(%d,%d) = %d,%v len %d; want %d,%v len %d",
				i, s.target, s.limit, removed, done, x.Len(), s.removed, s.done, s.len)
		}
		checkInvariants(t, x)
		// Eviction is LRU by path: oldest whole paths go first, each path
		// leaf first, so survivors are always full prefixes of the newest paths.
		for _, p := range all {
			present := 0
			for _, h := range p {
				if x.Holders(h) != nil {
					present++
				}
			}
			for j := range present {
				if x.Holders(p[j]) == nil {
					t.Fatalf("step %d: hole in path %#x", i, p)
				}
			}
		}
	}
	if st := x.Stats(); st.Evicted != 30 || st.Entries != 0 {
		t.Errorf("stats %+v", st)
	}
	// The newest path was evicted last: re-insert and check it is reusable.
	x.Insert(all[9], 1, 100)
	checkInvariants(t, x)
	if x.Len() != 3 {
		t.Errorf("Len=%d after re-insert", x.Len())
	}
}

func TestEvictOrderIsLRU(t *testing.T) {
	x := New(Options{MaxEntries: 100})
	a, b, c := hashes("aa", 2), hashes("bb", 2), hashes("cc", 2)
	x.Insert(a, 1, 1)
	x.Insert(b, 1, 2)
	x.Insert(c, 1, 3)
	x.Insert(a, 2, 4) // a is now the most recent
	var m Match
	x.Lookup(b, &m) // lookups do not touch
	x.Evict(2, 0)
	if x.Holders(b[0]) != nil || x.Holders(a[0]) == nil || x.Holders(c[0]) == nil {
		t.Errorf("evicted the wrong entry: order %#x", lruOrder(x))
	}
	x.Evict(1, 0)
	if x.Holders(a[0]) == nil || x.Len() != 1 {
		t.Errorf("evicted the wrong entry: order %#x", lruOrder(x))
	}
}

func TestExpireBefore(t *testing.T) {
	x := New(Options{MaxEntries: 100})
	for i := range 10 {
		x.Insert(hashes(strings.Repeat(string(rune('a'+i)), 4), 2), 1, int64(100+i)) // 2 blocks, used 100+i
	}
	steps := []struct {
		cutoff  int64
		limit   int
		removed int
		done    bool
		len     int
	}{
		{100, 0, 0, true, 20},  // nothing strictly older than 100
		{103, 0, 6, true, 14},  // used 100,101,102 -> 3 paths
		{106, 2, 2, false, 12}, // limit
		{106, 2, 2, false, 10},
		{106, 2, 2, true, 8}, // done: the tail is now fresh (used 106)
		{106, 2, 0, true, 8},
		{1000, -1, 8, true, 0},
		{1000, 0, 0, true, 0},
	}
	for i, s := range steps {
		removed, done := x.ExpireBefore(s.cutoff, s.limit)
		if removed != s.removed || done != s.done || x.Len() != s.len {
			t.Fatalf("step %d ExpireBefore(%d,%d) = %d,%v len %d; want %d,%v len %d",
				i, s.cutoff, s.limit, removed, done, x.Len(), s.removed, s.done, s.len)
		}
		checkInvariants(t, x)
		x.Walk(func(_ uint64, used int64, _ []Holder) bool {
			if done && used < s.cutoff {
				t.Fatalf("step %d: entry used at %d survived cutoff %d", i, used, s.cutoff)
			}
			return true
		})
	}
	if x.Stats().Evicted != 20 {
		t.Errorf("Evicted=%d want 20", x.Stats().Evicted)
	}
}

// A refreshed entry is not expired even if it was inserted long ago.
func TestExpireRespectsRefresh(t *testing.T) {
	x := New(Options{MaxEntries: 100})
	old, fresh := hashes("aaaa", 2), hashes("bbbb", 2)
	x.Insert(old, 1, 1)
	x.Insert(fresh, 1, 2)
	x.Insert(old[:1], 2, 50) // only the root of old is touched
	x.ExpireBefore(10, 0)
	// fresh (used 2) and old's leaf (used 1) go; old's root stays.
	if x.Len() != 1 || x.Holders(old[0]) == nil {
		t.Errorf("after expiry: %#x", lruOrder(x))
	}
	checkInvariants(t, x)
}

func TestCeilingSkip(t *testing.T) {
	x := New(Options{MaxEntries: 4, Headroom: 2}) // ceiling 6
	a := hashes("aabbccdd", 2)                    // 4 blocks
	b := hashes("aaxxyyzzww", 2)                  // shares block 0 with a, 4 new blocks
	if n := x.Insert(a, 1, 1); n != 0 {
		t.Fatalf("skipped %d", n)
	}
	// Room for 2 of b's 4 new blocks: the shallowest ones are stored (a
	// deeper block without its parent could never be matched).
	if n := x.Insert(b, 2, 2); n != 2 {
		t.Errorf("skipped %d, want 2", n)
	}
	checkInvariants(t, x)
	if x.Len() != 6 {
		t.Errorf("Len=%d want 6", x.Len())
	}
	if st := x.Stats(); st.SkippedInserts != 2 || st.Evicted != 0 {
		t.Errorf("stats %+v", st)
	}
	var m Match
	x.Lookup(b, &m)
	if got := matchMap(t, &m); !maps.Equal(got, map[WorkerID]int{1: 1, 2: 3}) {
		t.Errorf("Lookup(b) = %v, want worker 2 holding the 3 stored blocks", got)
	}
	for _, h := range b[3:] {
		if x.Holders(h) != nil {
			t.Errorf("block past the cut stored")
		}
	}
	// Existing entries are still refreshed when full.
	if n := x.Insert(a, 3, 3); n != 0 {
		t.Errorf("refresh skipped %d", n)
	}
	if got := holderMap(x.Holders(a[3])); !maps.Equal(got, map[WorkerID]int64{1: 1, 3: 3}) {
		t.Errorf("holders %v", got)
	}
	// Entirely new path, index full: everything skipped and counted.
	if n := x.Insert(hashes("qqrr", 2), 1, 4); n != 2 {
		t.Errorf("skipped %d want 2", n)
	}
	if x.Stats().SkippedInserts != 4 {
		t.Errorf("SkippedInserts=%d want 4", x.Stats().SkippedInserts)
	}
	// After an eviction pass there is room again.
	x.Evict(4, 0)
	if n := x.Insert(hashes("qqrr", 2), 1, 5); n != 0 || x.Len() != 6 {
		t.Errorf("after Evict: skipped %d, len %d", n, x.Len())
	}
	checkInvariants(t, x)
}

func TestInlineEvict(t *testing.T) {
	x := New(Options{MaxEntries: 6, Headroom: 100, InlineEvict: true})
	paths := make([][]uint64, 5)
	for i := range paths {
		paths[i] = hashes(strings.Repeat(string(rune('a'+i)), 4), 2) // 2 blocks each
	}
	x.Insert(paths[0], 0, 1)
	x.Insert(paths[1], 1, 2)
	x.Insert(paths[2], 2, 3)
	x.Insert(paths[0], 0, 4) // refresh: paths[1] is now the oldest
	if n := x.Insert(paths[3], 3, 5); n != 0 {
		t.Errorf("inline insert skipped %d", n)
	}
	checkInvariants(t, x)
	if x.Len() != 6 {
		t.Errorf("Len=%d want 6", x.Len())
	}
	for i, p := range paths {
		want := i != 1 && i != 4
		for _, h := range p {
			if (x.Holders(h) != nil) != want {
				t.Errorf("path %d present=%v, want %v", i, !want, want)
			}
		}
	}
	if st := x.Stats(); st.Evicted != 2 || st.SkippedInserts != 0 {
		t.Errorf("stats %+v", st)
	}

	// A path longer than the index keeps its shallowest blocks.
	long := hashes("0011223344556677", 2) // 8 blocks
	if n := x.Insert(long, 9, 6); n != 0 {
		t.Errorf("skipped %d", n)
	}
	checkInvariants(t, x)
	var m Match
	x.Lookup(long, &m)
	if m.BlocksFor(9) != 6 || x.Len() != 6 {
		t.Errorf("long path: worker 9 holds %d blocks, len %d", m.BlocksFor(9), x.Len())
	}
}

// When an inline eviction is needed while extending a path, the path's own
// existing blocks must not be the victims: their other holders would be lost
// and the block re-created for the new worker only.
func TestInlineEvictKeepsPathHolders(t *testing.T) {
	x := New(Options{MaxEntries: 4, InlineEvict: true})
	prev := hashes("aabb", 2) // previous turn, held by workers 1 and 2
	x.Insert(prev, 1, 1)
	x.Insert(prev, 2, 1)
	x.Insert(hashes("zzyy", 2), 3, 2) // newer: prev is now the LRU tail
	ext := hashes("aabbcc", 2)        // extends prev by one block
	x.Insert(ext, 4, 3)
	checkInvariants(t, x)
	for _, h := range ext[:2] {
		if got := holderMap(x.Holders(h)); !maps.Equal(got, map[WorkerID]int64{1: 1, 2: 1, 4: 3}) {
			t.Errorf("holders of an extended block: %v, want workers 1, 2 and 4", got)
		}
	}
	if x.Len() != 4 || x.Stats().Evicted != 1 {
		t.Errorf("len %d, stats %+v: want 1 unrelated entry evicted", x.Len(), x.Stats())
	}
}

func TestRemoveHolder(t *testing.T) {
	p := hashes("aabbcc", 2)
	x := New(Options{MaxEntries: 100})
	x.Insert(p, 1, 1)
	x.Insert(p[:2], 2, 2)
	x.Insert(p[:1], 3, 3)

	x.RemoveHolder(p, 9)               // not a holder: no-op
	x.RemoveHolder(hashes("zz", 2), 1) // unknown hash: no-op
	x.RemoveHolder(nil, 1)
	if x.Len() != 3 {
		t.Fatalf("no-op removes changed Len to %d", x.Len())
	}
	x.RemoveHolder(p[1:], 1) // the decision that added blocks 1..2 for worker 1
	checkInvariants(t, x)
	if x.Len() != 2 || x.Holders(p[2]) != nil {
		t.Errorf("block held only by worker 1 not freed: len %d", x.Len())
	}
	if got := holderMap(x.Holders(p[1])); !maps.Equal(got, map[WorkerID]int64{2: 2}) {
		t.Errorf("holders of p1 %v", got)
	}
	if got := holderMap(x.Holders(p[0])); !maps.Equal(got, map[WorkerID]int64{1: 1, 2: 2, 3: 3}) {
		t.Errorf("holders of p0 %v", got)
	}
	// Remove the first holder of a shared entry: the others stay.
	x.RemoveHolder(p[:1], 1)
	x.RemoveHolder(p[:1], 3)
	if got := holderMap(x.Holders(p[0])); !maps.Equal(got, map[WorkerID]int64{2: 2}) {
		t.Errorf("holders of p0 %v", got)
	}
	x.RemoveHolder(p, 2)
	checkInvariants(t, x)
	if x.Len() != 0 {
		t.Errorf("Len=%d want 0", x.Len())
	}
	if st := x.Stats(); st.Evicted != 0 {
		t.Errorf("RemoveHolder counted as eviction: %+v", st)
	}
}

func TestRemoveWorker(t *testing.T) {
	x := New(Options{MaxEntries: 1000})
	insertShortPaths(x, 1, 200)
	checkInvariants(t, x)
	before := map[uint64]map[WorkerID]int64{}
	x.Walk(func(h uint64, _ int64, hs []Holder) bool { before[h] = holderMap(hs); return true })
	orderBefore := lruOrder(x)

	x.RemoveWorker(2)
	x.RemoveWorker(77) // unknown
	checkInvariants(t, x)
	for h, hs := range before {
		delete(hs, 2)
		got := holderMap(x.Holders(h))
		if len(hs) == 0 {
			if got != nil {
				t.Fatalf("entry held only by worker 2 survived")
			}
			continue
		}
		if !maps.Equal(got, hs) {
			t.Fatalf("holders %v want %v", got, hs)
		}
	}
	// Survivors keep their relative LRU order.
	var kept []uint64
	for _, h := range orderBefore {
		if x.Holders(h) != nil {
			kept = append(kept, h)
		}
	}
	if !slices.Equal(kept, lruOrder(x)) {
		t.Error("RemoveWorker reordered the LRU list")
	}
	for _, w := range []WorkerID{0, 1, 3} {
		x.RemoveWorker(w)
	}
	if x.Len() != 0 {
		t.Errorf("Len=%d after removing every worker", x.Len())
	}
	checkInvariants(t, x)
}

func TestClear(t *testing.T) {
	x := New(Options{MaxEntries: 100})
	p := hashes("aabbcc", 2)
	x.Insert(p, 1, 1)
	x.Insert(hashes("xx", 2), 1, 1)
	x.RemoveHolder(p[2:], 1) // leave a free slot behind
	x.Clear()
	checkInvariants(t, x)
	if x.Len() != 0 || lruOrder(x) != nil || x.Stats().Evicted != 3 {
		t.Errorf("after Clear: len %d stats %+v", x.Len(), x.Stats())
	}
	var m Match
	x.Lookup(p, &m)
	if m.Longest != 0 {
		t.Error("Lookup matches after Clear")
	}
	x.Insert(p, 2, 2)
	checkInvariants(t, x)
	x.Lookup(p, &m)
	if m.BlocksFor(2) != 3 || m.BlocksFor(1) != 0 {
		t.Errorf("after Clear+Insert: %+v", m)
	}
	x.Clear()
	x.Clear()
	if x.Stats().Evicted != 6 {
		t.Errorf("Evicted=%d want 6", x.Stats().Evicted)
	}
}

// Freed slots are reused: churn through many distinct paths (through
// eviction, expiry, RemoveHolder and RemoveWorker) and check the slab never
// grows past the peak number of live entries.
func TestSlotReuse(t *testing.T) {
	for _, inline := range []bool{false, true} {
		x := New(Options{MaxEntries: 64, Headroom: 16, InlineEvict: inline})
		r := newRand(2)
		for i := range 20_000 {
			text := make([]byte, 1+r.IntN(16))
			for j := range text {
				text[j] = byte(r.Uint32())
			}
			p := Hash(nil, "m", text, 2)
			w := WorkerID(r.IntN(4))
			x.Insert(p, w, int64(i))
			switch i % 5 {
			case 0:
				x.RemoveHolder(p, w)
			case 1:
				x.Evict(64, 10)
			case 2:
				x.ExpireBefore(int64(i-20), 0)
			case 3:
				if i%500 == 3 {
					x.RemoveWorker(w)
				}
			}
		}
		checkInvariants(t, x)
		if int(x.nslots) > x.ceiling {
			t.Errorf("inline=%v: slab grew to %d slots for ceiling %d", inline, x.nslots, x.ceiling)
		}
	}
}

// Ancestors are never evicted before their descendants: after any sequence
// of inserts and LRU evictions every surviving entry's parent is present.
// Runs with plenty of room, with the ceiling skipping new entries, and with
// inline eviction.
func TestPropertyAncestorsOutliveDescendants(t *testing.T) {
	modes := []struct {
		name string
		o    Options
	}{
		{"roomy", Options{MaxEntries: 10_000}},
		{"ceiling-skip", Options{MaxEntries: 150, Headroom: 50}},
		{"inline", Options{MaxEntries: 150, InlineEvict: true}},
	}
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			for seed := range uint64(8) {
				r := newRand(seed)
				x := New(mode.o)
				parent := map[uint64]uint64{} // hash -> parent hash (0 for roots)
				for i := range 400 {
					// Texts over a small alphabet share prefixes heavily.
					text := make([]byte, 1+r.IntN(24))
					for j := range text {
						text[j] = 'a' + byte(r.IntN(3))
					}
					p := Hash(nil, "m", text, 2)
					for j, h := range p {
						if j > 0 {
							parent[h] = p[j-1]
						} else {
							parent[h] = 0
						}
					}
					x.Insert(p, WorkerID(r.IntN(5)), int64(i))
					if r.IntN(10) == 0 {
						x.Evict(r.IntN(x.Len()+1), r.IntN(20))
					}
					if r.IntN(20) == 0 {
						x.ExpireBefore(int64(i-r.IntN(100)), r.IntN(20))
					}
					if i%8 == 0 {
						checkParents(t, x, parent)
					}
				}
				for x.Len() > 0 {
					x.Evict(x.Len()-1-r.IntN(x.Len()), 1+r.IntN(7))
					checkParents(t, x, parent)
				}
				checkInvariants(t, x)
			}
		})
	}
}

func checkParents(t *testing.T, x *Index, parent map[uint64]uint64) {
	t.Helper()
	x.Walk(func(h uint64, _ int64, _ []Holder) bool {
		for p := parent[h]; p != 0; p = parent[p] {
			if x.Holders(p) == nil {
				t.Fatalf("entry %#x survives its ancestor %#x (len %d)", h, p, x.Len())
			}
		}
		return true
	})
}

// TestMemoryPerEntry reports the heap cost of one entry (slab slot, map
// slot and LRU links) and guards against accidental growth.
func TestMemoryPerEntry(t *testing.T) {
	if raceEnabled || testing.Short() {
		t.Skip("memory accounting is skewed under -race; skipped in -short")
	}
	const n = 200_000
	bpe := measureBytesPerEntry(n)
	t.Logf("%.1f bytes/entry at %d entries", bpe, n)
	if bpe > 250 {
		t.Errorf("%.1f bytes per entry, want <= 250", bpe)
	}
}

// measureBytesPerEntry builds an index of n entries (paths of 100 blocks,
// 8 workers) and returns the live heap it takes per entry.
func measureBytesPerEntry(n int) float64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	x := fillIndex(Options{MaxEntries: n, InlineEvict: true}, n, 100, 8, 1)
	runtime.GC()
	runtime.ReadMemStats(&after)
	bpe := float64(after.HeapAlloc-before.HeapAlloc) / float64(x.Len())
	runtime.KeepAlive(x)
	return bpe
}

// fillIndex inserts synthetic random paths of pathLen blocks, round-robin
// over workers, until the index holds n entries.
func fillIndex(o Options, n, pathLen, workers int, seed uint64) *Index {
	x := New(o)
	r := newRand(seed)
	p := make([]uint64, pathLen)
	for i := 0; x.Len() < n; i++ {
		k := min(pathLen, n-x.Len())
		for j := range k {
			p[j] = r.Uint64()
		}
		x.Insert(p[:k], WorkerID(i%workers), int64(i))
	}
	return x
}

// HeldPrefix counts the leading blocks a worker holds, stopping at the
// first gap even if later blocks are held.
func TestHeldPrefix(t *testing.T) {
	x := New(Options{MaxEntries: 100})
	x.Insert([]uint64{1, 2, 3}, 1, 10)
	x.Insert([]uint64{5}, 1, 10)
	x.Insert([]uint64{1, 2, 3, 4}, 2, 10)
	for _, tc := range []struct {
		hashes []uint64
		w      WorkerID
		want   int
	}{
		{[]uint64{1, 2, 3, 4, 5}, 1, 3},
		{[]uint64{1, 2, 3, 4, 5}, 2, 4},
		{[]uint64{9, 1}, 1, 0},
		{nil, 1, 0},
	} {
		if got := x.HeldPrefix(tc.hashes, tc.w); got != tc.want {
			t.Errorf("HeldPrefix(%v, %d) = %d, want %d", tc.hashes, tc.w, got, tc.want)
		}
	}
}

// A reserved map serves one reset: a second index reset to the same
// Reserved gets a fresh map, not one shared with the first.
func TestResetToTakesTheReservedMapOnce(t *testing.T) {
	x, y := New(Options{MaxEntries: 100}), New(Options{MaxEntries: 100})
	x.Insert([]uint64{1, 2, 3}, 1, 1)
	r := Reserve(100)
	x.ResetTo(r)
	y.ResetTo(r)
	x.Insert([]uint64{4, 5}, 1, 2)
	y.Insert([]uint64{6}, 2, 2)
	if x.Len() != 2 || y.Len() != 1 {
		t.Fatalf("after the resets: %d and %d entries, want 2 and 1", x.Len(), y.Len())
	}
	checkInvariants(t, x)
	checkInvariants(t, y)
	if st := x.Stats(); st.Evicted != 3 {
		t.Fatalf("reset counted %d evicted, want the 3 entries dropped", st.Evicted)
	}
}
