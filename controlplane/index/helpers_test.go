package index

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// checkInvariants verifies the internal structure: the LRU list is a
// well-formed doubly linked list over exactly the live entries, the map and
// the slab agree, every entry has at least one holder and no duplicates,
// free slots are really free, and the ceiling holds.
func checkInvariants(t testing.TB, x *Index) {
	t.Helper()
	if err := invariantErr(x); err != nil {
		t.Fatal(err)
	}
}

func invariantErr(x *Index) error {
	if x.byHash.len() > x.ceiling {
		return fmt.Errorf("len %d exceeds ceiling %d", x.byHash.len(), x.ceiling)
	}
	if err := tableErr(&x.byHash); err != nil {
		return err
	}
	free := 0
	for s := x.freeHead; s != nilSlot; s = x.at(s).next {
		if free++; free > int(x.nslots) {
			return fmt.Errorf("free list cycle")
		}
		if e := x.at(s); e.nholders != 0 || e.prev != nilSlot {
			return fmt.Errorf("free slot %d in use: nholders=%d prev=%d", s, e.nholders, e.prev)
		}
		if got, ok := x.find(x.at(s).hash); ok && got == s {
			return fmt.Errorf("free slot %d still indexed", s)
		}
	}
	if int(x.nslots) != x.byHash.len()+free {
		return fmt.Errorf("slots %d != live %d + free %d", x.nslots, x.byHash.len(), free)
	}
	if want := (int(x.nslots) + pageSize - 1) / pageSize; len(x.pages) != want {
		return fmt.Errorf("%d pages for %d slots", len(x.pages), x.nslots)
	}
	seen := make(map[int32]bool, x.byHash.len())
	n := 0
	prev := int32(nilSlot)
	for s := x.head; s != nilSlot; s = x.at(s).next {
		if seen[s] {
			return fmt.Errorf("LRU cycle at slot %d", s)
		}
		seen[s] = true
		n++
		e := x.at(s)
		if e.prev != prev {
			return fmt.Errorf("slot %d prev=%d want %d", s, e.prev, prev)
		}
		if got, ok := x.find(e.hash); !ok || got != s {
			return fmt.Errorf("slot %d hash %x maps to %d,%v", s, e.hash, got, ok)
		}
		if e.nholders < 1 || int(e.nholders) != 1+len(e.more) {
			return fmt.Errorf("slot %d nholders=%d more=%d", s, e.nholders, len(e.more))
		}
		ws := []WorkerID{e.first.w}
		for _, h := range e.more {
			ws = append(ws, h.w)
		}
		slices.Sort(ws)
		if len(slices.Compact(ws)) != int(e.nholders) {
			return fmt.Errorf("slot %d has duplicate holders", s)
		}
		prev = s
	}
	if x.tail != prev {
		return fmt.Errorf("tail=%d, list ends at %d", x.tail, prev)
	}
	if n != x.byHash.len() {
		return fmt.Errorf("LRU list has %d entries, map %d", n, x.byHash.len())
	}
	for s := x.freeHead; s != nilSlot; s = x.at(s).next {
		if seen[s] {
			return fmt.Errorf("free slot %d is on the LRU list", s)
		}
	}
	return nil
}

// hashes returns the chained hashes of text under model "m".
func hashes(text string, blockChars int) []uint64 {
	return Hash(nil, "m", []byte(text), blockChars)
}

// matchMap turns a Match into worker -> blocks, failing on duplicates.
func matchMap(t testing.TB, m *Match) map[WorkerID]int {
	t.Helper()
	if len(m.Workers) != len(m.Blocks) {
		t.Fatalf("Match: %d workers, %d block counts", len(m.Workers), len(m.Blocks))
	}
	out := make(map[WorkerID]int, len(m.Workers))
	for i, w := range m.Workers {
		if _, dup := out[w]; dup {
			t.Fatalf("Match lists worker %d twice", w)
		}
		out[w] = m.Blocks[i]
	}
	return out
}

func holderMap(hs []Holder) map[WorkerID]int64 {
	if hs == nil {
		return nil
	}
	out := make(map[WorkerID]int64, len(hs))
	for _, h := range hs {
		out[h.Worker] = h.At
	}
	return out
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0xda3e39cb94b95bdb)) }

// lruOrder returns the hashes from most to least recently used.
func lruOrder(x *Index) []uint64 {
	var out []uint64
	x.Walk(func(h uint64, _ int64, _ []Holder) bool {
		out = append(out, h)
		return true
	})
	return out
}

// insertShortPaths inserts n short random paths over a three-letter
// alphabet (so they share prefixes) for four workers.
func insertShortPaths(x *Index, seed uint64, n int) {
	r := newRand(seed)
	for i := range n {
		text := make([]byte, 2+r.IntN(10))
		for j := range text {
			text[j] = 'a' + byte(r.IntN(3))
		}
		x.Insert(Hash(nil, "m", text, 2), WorkerID(r.IntN(4)), int64(i))
	}
}
