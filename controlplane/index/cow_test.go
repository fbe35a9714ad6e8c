package index

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
)

// walkLines renders a walk (LRU order, holders sorted) for comparisons.
func walkLines(walk func(func(uint64, int64, []Holder) bool)) []string {
	var out []string
	walk(func(h uint64, used int64, hs []Holder) bool {
		hs = slices.Clone(hs)
		slices.SortFunc(hs, func(a, b Holder) int { return int(a.Worker) - int(b.Worker) })
		out = append(out, fmt.Sprintf("%x %d %v", h, used, hs))
		return true
	})
	return out
}

func viewLines(t *testing.T, v *View) []string {
	t.Helper()
	var err error
	lines := walkLines(func(fn func(uint64, int64, []Holder) bool) { err = v.Walk(fn) })
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

// churn applies one pseudo-random operation of every kind that writes the
// index, to both indexes.
func churn(r interface{ IntN(int) int }, i int, xs ...*Index) {
	text := make([]byte, 1+r.IntN(12))
	for j := range text {
		text[j] = byte('a' + r.IntN(4)) // few letters: shared prefixes, many holders
	}
	p := Hash(nil, "m", text, 2)
	w := WorkerID(r.IntN(5))
	op, trim := r.IntN(20), r.IntN(8)
	for _, x := range xs {
		switch {
		case op < 12:
			x.Insert(p, w, int64(i))
		case op < 15:
			x.RemoveHolder(p, w)
		case op < 17:
			x.Evict(x.Len()-trim, 4)
		case op < 18:
			x.ExpireBefore(int64(i-300), 16)
		case op < 19:
			x.RemoveWorker(w)
		default:
			x.PutBack(p[0], int64(i), []Holder{{Worker: w, At: int64(i)}, {Worker: w + 1, At: int64(i - 1)}})
		}
	}
}

// A frozen view keeps showing exactly the index as it was at Freeze while
// every kind of write goes on, with several views alive at once, and the
// live index behaves exactly like a twin that was never frozen.
func TestFreezeKeepsTheViewAndTheLiveIndexApart(t *testing.T) {
	for _, inline := range []bool{false, true} {
		o := Options{MaxEntries: 2000, Headroom: 200, InlineEvict: inline}
		x, twin := New(o), New(o)
		r := newRand(7)
		type frozen struct {
			v    *View
			want []string
		}
		var live []frozen
		for i := range 30_000 {
			churn(r, i, x, twin)
			switch {
			case i%997 == 0:
				live = append(live, frozen{x.Freeze(), walkLines(x.Walk)})
			case i%1499 == 0 && len(live) > 0:
				f := live[0]
				live = live[1:]
				if got := viewLines(t, f.v); !slices.Equal(got, f.want) {
					t.Fatalf("inline=%v op %d: view changed after freeze (%d lines, want %d)", inline, i, len(got), len(f.want))
				}
				if f.v.Len() != len(f.want) {
					t.Fatalf("view Len %d, walk %d", f.v.Len(), len(f.want))
				}
				f.v.Release()
			case i == 20_000:
				x.Clear()
				twin.Clear()
			}
		}
		for _, f := range live {
			if got := viewLines(t, f.v); !slices.Equal(got, f.want) {
				t.Fatalf("inline=%v: view changed after freeze", inline)
			}
			f.v.Release()
		}
		checkInvariants(t, x)
		if got, want := walkLines(x.Walk), walkLines(twin.Walk); !slices.Equal(got, want) {
			t.Fatalf("inline=%v: live index diverged from its never-frozen twin", inline)
		}
		if x.Stats() != twin.Stats() {
			t.Fatalf("stats %+v, twin %+v", x.Stats(), twin.Stats())
		}
	}
}

// Pages are copied only while a view may read them: after Release,
// writes go in place; while a view lives, the first write to a shared page
// copies it once.
func TestFreezeCopiesOnlyWhileAViewLives(t *testing.T) {
	x := New(Options{MaxEntries: 10 * pageSize})
	p := hashes("abcdefghij", 1)
	x.Insert(p, 1, 1)
	v := x.Freeze()
	before := x.pages[0]
	x.Insert(p[:1], 2, 2) // writes the page of p[0] and its neighbours
	if x.pages[0] == before {
		t.Fatal("a page shared with a live view was written in place")
	}
	copied := x.pages[0]
	x.Insert(p[:1], 3, 3)
	if x.pages[0] != copied {
		t.Fatal("a page already copied for this view was copied again")
	}
	v.Release()
	if err := v.Walk(func(uint64, int64, []Holder) bool { return true }); !errors.Is(err, ErrReleased) {
		t.Fatalf("Walk after Release: %v, want ErrReleased", err)
	}
	v.Release() // harmless
	x.Freeze().Release()
	owned := x.pages[0]
	x.Insert(p[:1], 4, 4)
	if x.pages[0] != owned {
		t.Fatal("with every view released, a write copied instead of writing in place")
	}
	checkInvariants(t, x)
}

// At scale (hundreds of thousands of slots, thousands of pages), a view
// stays as frozen while inserts grow the slab into new pages and eviction
// frees and reuses slots everywhere.
func TestFreezeAtScale(t *testing.T) {
	if raceEnabled {
		t.Skip("200k inserts take ~10 s under the race detector; the other freeze tests cover races")
	}
	const n = 200_000
	x := New(Options{MaxEntries: n, InlineEvict: true})
	r := newRand(11)
	path := make([]uint64, 50)
	fill := func(count int, at int64) {
		for range count / len(path) {
			for j := range path {
				path[j] = r.Uint64()
			}
			x.Insert(path, WorkerID(r.IntN(4)), at)
		}
	}
	fill(n/2, 1)
	want := walkLines(x.Walk)
	v := x.Freeze()
	fill(n, 2) // grows into new pages, then evicts
	x.Evict(x.Len()/2, 0)
	fill(n/4, 3)
	if got := viewLines(t, v); !slices.Equal(got, want) {
		t.Fatalf("view changed: %d lines, want %d", len(got), len(want))
	}
	v.Release()
	checkInvariants(t, x)
}

// A view is read by another goroutine (the snapshot writer) while the
// owner keeps writing: under -race this proves they share no written
// memory.
func TestViewReadConcurrentlyWithWrites(t *testing.T) {
	x := New(Options{MaxEntries: 4000, InlineEvict: true})
	r := newRand(3)
	for i := range 5000 {
		churn(r, i, x)
	}
	want := walkLines(x.Walk)
	v := x.Freeze()
	var got []string
	var err error
	var wg sync.WaitGroup
	wg.Go(func() {
		got = walkLines(func(fn func(uint64, int64, []Holder) bool) { err = v.Walk(fn) })
	})
	for i := 5000; i < 15000; i++ {
		churn(r, i, x)
	}
	wg.Wait()
	v.Release()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("view read concurrently differs from the index at freeze (%d vs %d lines)", len(got), len(want))
	}
	checkInvariants(t, x)
}
