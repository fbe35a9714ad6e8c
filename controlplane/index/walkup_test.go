package index

import (
	"slices"
	"testing"
)

// walkUpAll runs a walk to its end in steps of limit, calling between
// before each step, and returns the hashes visited in order.
func walkUpAll(t *testing.T, x *Index, limit int, between func(step int)) []uint64 {
	t.Helper()
	var got []uint64
	x.StartWalkUp()
	for step := 0; ; step++ {
		if step > 1_000_000 {
			t.Fatal("the walk does not end")
		}
		if between != nil {
			between(step)
		}
		done, ok := x.WalkUpStep(limit, func(h uint64, _ []Holder) { got = append(got, h) })
		if !ok {
			t.Fatal("the walk ended without reaching the head")
		}
		if done {
			return got
		}
	}
}

// On an index left alone, the stepped walk is Walk's order reversed.
func TestWalkUpIsWalkReversedOnAQuietIndex(t *testing.T) {
	x := fillIndex(Options{MaxEntries: 5000}, 5000, 7, 3, 1)
	want := lruOrder(x)
	slices.Reverse(want)
	for _, limit := range []int{1, 3, 64, 10_000} {
		if got := walkUpAll(t, x, limit, nil); !slices.Equal(got, want) {
			t.Fatalf("limit %d: walked %d entries, not Walk's %d in reverse", limit, len(got), len(want))
		}
	}
	if done, ok := x.WalkUpStep(10, func(uint64, []Holder) {}); done || ok {
		t.Fatal("a finished walk still steps")
	}
}

// Whatever the index does between steps (inserts moving entries to the
// front, withdrawals, evictions, expiry, removed workers, frozen views
// making writes copy pages), every entry present at the start and still
// present at the end is visited, and so is every entry present at the end
// (those are at or ahead of the walk).
func TestWalkUpVisitsEverySurvivorDespiteChanges(t *testing.T) {
	for _, inline := range []bool{false, true} {
		x := New(Options{MaxEntries: 3000, Headroom: 300, InlineEvict: inline})
		r := newRand(3)
		for i := range 5000 {
			churnNoPutBack(r, i, x)
		}
		start := map[uint64]bool{}
		for _, h := range lruOrder(x) {
			start[h] = true
		}
		var views []*View
		i := 5000
		got := walkUpAll(t, x, 5, func(step int) {
			for range 1 + r.IntN(6) {
				churnNoPutBack(r, i, x)
				i++
			}
			if step%50 == 0 {
				views = append(views, x.Freeze())
			}
		})
		for _, v := range views {
			v.Release()
		}
		seen := map[uint64]bool{}
		for _, h := range got {
			seen[h] = true
		}
		for _, h := range lruOrder(x) {
			if !seen[h] {
				t.Fatalf("inline=%v: entry %x present at the end was never visited (started present: %v)", inline, h, start[h])
			}
		}
		if len(start) == 0 || len(got) < len(start)/2 {
			t.Fatalf("inline=%v: walked %d of %d entries", inline, len(got), len(start))
		}
	}
}

// Reset and PutBack (a snapshot being installed) end the walk: the caller
// is told to start over rather than finishing a walk that missed entries.
func TestWalkUpEndsOnResetAndPutBack(t *testing.T) {
	for name, change := range map[string]func(x *Index){
		"reset":   func(x *Index) { x.Reset() },
		"clear":   func(x *Index) { x.Clear() },
		"putback": func(x *Index) { x.PutBack(1, 1, []Holder{{Worker: 1, At: 1}}) },
	} {
		x := fillIndex(Options{MaxEntries: 100}, 100, 5, 2, 1)
		x.StartWalkUp()
		if done, ok := x.WalkUpStep(10, func(uint64, []Holder) {}); done || !ok {
			t.Fatalf("%s: first step done %v ok %v", name, done, ok)
		}
		change(x)
		if _, ok := x.WalkUpStep(10, func(uint64, []Holder) {}); ok {
			t.Fatalf("%s: the walk went on", name)
		}
	}
}

// churnNoPutBack is churn without PutBack, which ends a walk by design.
func churnNoPutBack(r interface{ IntN(int) int }, i int, x *Index) {
	text := make([]byte, 1+r.IntN(12))
	for j := range text {
		text[j] = byte('a' + r.IntN(4))
	}
	p := Hash(nil, "m", text, 2)
	w := WorkerID(r.IntN(5))
	switch op, trim := r.IntN(20), r.IntN(8); {
	case op < 13:
		x.Insert(p, w, int64(i))
	case op < 16:
		x.RemoveHolder(p, w)
	case op < 18:
		x.Evict(x.Len()-trim, 4)
	case op < 19:
		x.ExpireBefore(int64(i-300), 16)
	default:
		x.RemoveWorker(w)
	}
}
