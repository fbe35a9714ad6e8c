package index

import (
	"fmt"
	"slices"
	"testing"
)

// touchedEntry is everything Walk shows of an index or a view, in LRU order.
type touchedEntry struct {
	hash    uint64
	used    int64
	holders string
}

func walkState(walk func(func(uint64, int64, []Holder) bool)) []touchedEntry {
	var out []touchedEntry
	walk(func(h uint64, used int64, hs []Holder) bool {
		hs = slices.Clone(hs)
		slices.SortFunc(hs, func(a, b Holder) int { return int(a.Worker) - int(b.Worker) })
		out = append(out, touchedEntry{h, used, fmt.Sprint(hs)})
		return true
	})
	return out
}

// TouchHeld is HeldPrefix then Insert of the held prefix: the same count,
// times, holders and LRU order, whether or not a frozen view shares the
// pages (which it must leave as they were).
func TestTouchHeldIsHeldPrefixThenInsert(t *testing.T) {
	// Worker 1 holds 1-2-3-4; worker 2 holds 1-2-5 and 7; 6 is absent.
	build := func() *Index {
		x := New(Options{MaxEntries: 16})
		x.Insert([]uint64{1, 2, 3, 4}, 1, 10)
		x.Insert([]uint64{1, 2, 5}, 2, 20)
		x.Insert([]uint64{7}, 2, 30)
		return x
	}
	cases := []struct {
		name   string
		hashes []uint64
		w      WorkerID
		want   int
	}{
		{"whole path", []uint64{1, 2, 3, 4}, 1, 4},
		{"shared blocks", []uint64{1, 2, 5}, 2, 3},
		{"stops at a block another worker holds", []uint64{1, 2, 5, 4}, 1, 2},
		{"stops at an absent block", []uint64{1, 6, 3}, 1, 1},
		{"first block not held", []uint64{7, 1, 2}, 1, 0},
		{"first block absent", []uint64{6, 1}, 1, 0},
		{"empty", nil, 1, 0},
		{"unknown worker", []uint64{1, 2}, 9, 0},
		{"a block twice", []uint64{1, 2, 1}, 1, 3},
	}
	for _, c := range cases {
		for _, frozen := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/frozen=%v", c.name, frozen), func(t *testing.T) {
				got, ref := build(), build()
				var view *View
				if frozen {
					view = got.Freeze()
					defer view.Release()
				}
				before := walkState(got.Walk)
				n := got.TouchHeld(c.hashes, c.w, 100)
				refN := ref.HeldPrefix(c.hashes, c.w)
				if refN > 0 {
					ref.Insert(c.hashes[:refN], c.w, 100)
				}
				if n != c.want || refN != c.want {
					t.Fatalf("TouchHeld %d, HeldPrefix %d, want %d", n, refN, c.want)
				}
				checkInvariants(t, got)
				if g, r := walkState(got.Walk), walkState(ref.Walk); !slices.Equal(g, r) {
					t.Fatalf("after TouchHeld:\n%v\nafter HeldPrefix+Insert:\n%v", g, r)
				}
				if view != nil {
					var vs []touchedEntry
					err := view.Walk(func(h uint64, used int64, hs []Holder) bool {
						vs = append(vs, walkState(func(fn func(uint64, int64, []Holder) bool) { fn(h, used, hs) })...)
						return true
					})
					if err != nil || !slices.Equal(vs, before) {
						t.Fatalf("frozen view changed (%v):\n%v\nwas\n%v", err, vs, before)
					}
				}
			})
		}
	}
}
