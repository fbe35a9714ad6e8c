package index

import (
	"slices"
	"testing"
)

type pair struct {
	h uint64
	w WorkerID
}

// Every way a (block, worker) pair leaves the index is reported, so state
// kept beside the index per worker can follow it.
func TestOnReleaseReportsEveryRemoval(t *testing.T) {
	x := New(Options{MaxEntries: 3, InlineEvict: true})
	var got []pair
	x.OnRelease(func(h uint64, w WorkerID) { got = append(got, pair{h, w}) })
	x.Insert([]uint64{1, 2}, 7, 10)
	x.Insert([]uint64{1}, 8, 11)
	// Inline eviction of the LRU entry (2, held by 7).
	x.Insert([]uint64{3, 4}, 9, 12)
	if want := []pair{{2, 7}}; !slices.Equal(got, want) {
		t.Fatalf("inline eviction reported %v, want %v", got, want)
	}
	got = nil
	x.RemoveHolder([]uint64{1, 99}, 8)
	if want := []pair{{1, 8}}; !slices.Equal(got, want) {
		t.Fatalf("RemoveHolder reported %v, want %v", got, want)
	}
	got = nil
	x.RemoveHolder([]uint64{1}, 8) // no longer a holder: nothing to report
	if len(got) != 0 {
		t.Fatalf("a second RemoveHolder reported %v", got)
	}
	x.Evict(1, 0)
	x.Clear()
	slices.SortFunc(got, func(a, b pair) int { return int(a.h) - int(b.h) })
	if want := []pair{{1, 7}, {3, 9}, {4, 9}}; !slices.Equal(got, want) {
		t.Fatalf("Evict and Clear reported %v, want %v", got, want)
	}
	if x.Ceiling() != 3 {
		t.Fatalf("Ceiling %d, want 3", x.Ceiling())
	}
}
