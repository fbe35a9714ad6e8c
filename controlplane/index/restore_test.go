package index

import (
	"maps"
	"slices"
	"testing"
)

type walked struct {
	hash    uint64
	used    int64
	holders []Holder
}

func walkAll(x *Index) []walked {
	var out []walked
	x.Walk(func(h uint64, used int64, hs []Holder) bool {
		out = append(out, walked{h, used, slices.Clone(hs)})
		return true
	})
	return out
}

func restore(o Options, snap []walked) *Index {
	y := New(o)
	for _, w := range snap {
		y.PutBack(w.hash, w.used, w.holders)
	}
	return y
}

func sameContent(t *testing.T, x, y *Index) {
	t.Helper()
	a, b := walkAll(x), walkAll(y)
	if len(a) != len(b) {
		t.Fatalf("%d entries vs %d", len(a), len(b))
	}
	for i := range a {
		if a[i].hash != b[i].hash || a[i].used != b[i].used ||
			!maps.Equal(holderMap(a[i].holders), holderMap(b[i].holders)) {
			t.Fatalf("entry %d: %+v vs %+v", i, a[i], b[i])
		}
	}
}

// A Walk snapshot put back in order rebuilds the same index: entries,
// holders, times and LRU order, so lookups and evictions agree.
func TestPutBackRestoresSnapshot(t *testing.T) {
	o := Options{MaxEntries: 300, Headroom: 20}
	x := New(o)
	r := newRand(5)
	var paths [][]uint64
	for i := range 300 {
		text := make([]byte, 1+r.IntN(20))
		for j := range text {
			text[j] = 'a' + byte(r.IntN(3))
		}
		p := Hash(nil, "m", text, 2)
		paths = append(paths, p)
		x.Insert(p, WorkerID(r.IntN(4)), int64(i))
		if i%7 == 0 {
			x.RemoveHolder(p[len(p)/2:], WorkerID(r.IntN(4)))
		}
	}
	y := restore(o, walkAll(x))
	checkInvariants(t, y)
	sameContent(t, x, y)
	var mx, my Match
	for _, p := range paths {
		x.Lookup(p, &mx)
		y.Lookup(p, &my)
		if !maps.Equal(matchMap(t, &mx), matchMap(t, &my)) || mx.Longest != my.Longest {
			t.Fatalf("lookup differs after restore")
		}
	}
	// Both evolve identically afterwards.
	for i, p := range paths[:50] {
		x.Insert(p, 9, int64(1000+i))
		y.Insert(p, 9, int64(1000+i))
	}
	x.Evict(100, 0)
	y.Evict(100, 0)
	x.ExpireBefore(1010, 0)
	y.ExpireBefore(1010, 0)
	checkInvariants(t, y)
	sameContent(t, x, y)
}

func TestPutBack(t *testing.T) {
	x := New(Options{MaxEntries: 10})
	x.PutBack(1, 50, []Holder{{Worker: 1, At: 50}, {Worker: 2, At: 40}})
	x.PutBack(2, 30, []Holder{{Worker: 3, At: 30}})
	x.PutBack(3, 20, nil) // no holders: ignored
	checkInvariants(t, x)
	if got := lruOrder(x); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("order %v", got)
	}
	// Duplicate holders collapse; an existing entry is replaced.
	x.PutBack(1, 10, []Holder{{Worker: 4, At: 5}, {Worker: 4, At: 10}})
	checkInvariants(t, x)
	if got := lruOrder(x); !slices.Equal(got, []uint64{2, 1}) {
		t.Errorf("order %v", got)
	}
	if got := holderMap(x.Holders(1)); !maps.Equal(got, map[WorkerID]int64{4: 10}) {
		t.Errorf("holders %v", got)
	}
	if x.Len() != 2 || x.Stats().Evicted != 0 {
		t.Errorf("len %d stats %+v", x.Len(), x.Stats())
	}
}

// PutBack ignores the ceiling; inserts into such an over-full index store
// nothing new (or evict inline) and never grow it further.
func TestPutBackBeyondCeiling(t *testing.T) {
	for _, inline := range []bool{false, true} {
		x := New(Options{MaxEntries: 3, InlineEvict: inline})
		for h := range uint64(5) {
			x.PutBack(h+1, 10, []Holder{{Worker: 1, At: 10}})
		}
		if x.Len() != 5 {
			t.Fatalf("len %d", x.Len())
		}
		p := hashes("aabb", 2)
		n := x.Insert(p, 2, 20)
		if x.Len() > 5 {
			t.Errorf("inline=%v: len grew to %d", inline, x.Len())
		}
		if inline && (n != 0 || x.Holders(p[0]) == nil || x.Holders(p[1]) == nil) {
			t.Errorf("inline: skipped %d", n)
		}
		if !inline && (n != 2 || x.Holders(p[0]) != nil) {
			t.Errorf("skip mode: skipped %d", n)
		}
		x.Evict(3, 0)
		checkInvariants(t, x)
	}
}
