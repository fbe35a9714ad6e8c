package index

import (
	"fmt"
	"testing"
)

// identityTable returns an empty table of size slots whose mix is the
// identity (k0 = 0, k1 = 1: the product's high half is 0, its low half the
// key), so a key's top bits are its home and its top 32 bits its
// fingerprint: the tests place keys where they want.
func identityTable(size int) *table {
	t := newTable(0)
	t.k0, t.k1 = 0, 1
	t.setSlots(make([]uint64, size))
	return &t
}

// at8 is a key of an 8-slot identity table with home h; keys with the same
// home and tag share a fingerprint and differ below bit 32.
func at8(home, tag, low uint64) uint64 { return home<<61 | tag<<32 | low }

// get looks h up, confirming candidates against keyOf as Index.find does.
func get(t *table, keyOf func(int32) uint64, h uint64) (int32, bool) {
	for c := t.probe(h); ; {
		v, ok := t.next(&c)
		if !ok {
			return 0, false
		}
		if keyOf(v) == h {
			return v, true
		}
	}
}

// tableErr checks the structure: every entry is reachable from its home
// without an empty slot in between (in its own array), and the count.
func tableErr(t *table) error {
	n := 0
	for ai, a := range [][]uint64{t.slots, t.old} {
		shift := t.shift + uint(ai)
		mask := uint64(len(a) - 1)
		for i, w := range a {
			if w == 0 {
				continue
			}
			n++
			for j := (w >> shift) & mask; j != uint64(i); j = (j + 1) & mask {
				if a[j] == 0 {
					return fmt.Errorf("array %d: slot %d (%#x) has a hole at %d after its home %d", ai, i, w, j, w>>shift)
				}
			}
		}
	}
	if n != t.n {
		return fmt.Errorf("%d entries stored, count says %d", n, t.n)
	}
	return nil
}

// The table-driven cases run on an 8-slot identity table: inserts then
// removes, and the array they must leave (values are listed as the keys'
// index + 1, 0 for empty).
func TestTableBackwardShift(t *testing.T) {
	keys := []uint64{
		at8(7, 0, 0), // 0: home 7
		at8(7, 0, 1), // 1: home 7, same fingerprint as 0: wraps to slot 0
		at8(0, 0, 0), // 2: home 0, pushed to 1
		at8(1, 0, 0), // 3: home 1, pushed to 2
		at8(6, 0, 0), // 4: home 6
		at8(3, 0, 0), // 5: home 3, alone
		at8(0, 1, 0), // 6: home 0, another fingerprint
	}
	for _, tc := range []struct {
		name   string
		insert []int
		remove []int
		want   [8]int // index+1 of the key in each slot
	}{
		{"no run", []int{5}, nil, [8]int{0, 0, 0, 6}},
		{"remove alone", []int{5}, []int{5}, [8]int{}},
		{"run wraps", []int{0, 1, 2, 3}, nil, [8]int{2, 3, 4, 0, 0, 0, 0, 1}},
		{"remove before wrap shifts across it", []int{0, 1, 2, 3}, []int{0}, [8]int{3, 4, 0, 0, 0, 0, 0, 2}},
		{"remove after wrap", []int{0, 1, 2, 3}, []int{1}, [8]int{3, 4, 0, 0, 0, 0, 0, 1}},
		{"entries past their home stay", []int{4, 0, 1, 5}, []int{4}, [8]int{2, 0, 0, 6, 0, 0, 0, 1}},
		{"entries at home stay across the wrap", []int{0, 2, 3}, []int{0}, [8]int{3, 4}},
		{"entry moves back to its home", []int{0, 1, 2}, []int{1}, [8]int{3, 0, 0, 0, 0, 0, 0, 1}},
		{"last removed empties", []int{0, 1, 2, 3}, []int{3, 2, 1, 0}, [8]int{}},
		{"fingerprint twins", []int{0, 1, 4, 6}, []int{0}, [8]int{7, 0, 0, 0, 0, 0, 5, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := identityTable(8)
			for _, k := range tc.insert {
				tb.insert(keys[k], int32(k))
			}
			for _, k := range tc.remove {
				if !tb.remove(keys[k], int32(k)) {
					t.Fatalf("remove %d: not found", k)
				}
			}
			var got [8]int
			for i, w := range tb.slots {
				if w != 0 {
					got[i] = int(uint32(w))
				}
			}
			if got != tc.want {
				t.Fatalf("slots %v, want %v", got, tc.want)
			}
			if err := tableErr(tb); err != nil {
				t.Fatal(err)
			}
			gone := map[int]bool{}
			for _, k := range tc.remove {
				gone[k] = true
			}
			keyOf := func(v int32) uint64 { return keys[v] }
			for _, k := range tc.insert {
				v, ok := get(tb, keyOf, keys[k])
				if ok == gone[k] || ok && v != int32(k) {
					t.Errorf("get key %d = %d, %v", k, v, ok)
				}
			}
			if tb.remove(at8(2, 5, 0), 3) {
				t.Error("removed an absent key")
			}
		})
	}
}

// Random seeds are per table: the same keys land in different places.
func TestTableSeedsDiffer(t *testing.T) {
	a, b := newTable(100), newTable(100)
	if a.k0 == b.k0 && a.k1 == b.k1 {
		t.Fatal("two tables share a seed")
	}
	same := true
	for k := uint64(0); k < 64; k++ {
		same = same && a.mix(k)>>a.shift == b.mix(k)>>b.shift
	}
	if same {
		t.Fatal("64 keys have the same homes in two tables")
	}
}

func TestSlotsFor(t *testing.T) {
	for _, tc := range []struct{ n, want int }{
		{-1, 8}, {0, 8}, {6, 8}, {7, 16}, {12, 16}, {13, 32},
		{1_000_000, 1 << 21}, {1_179_648, 1 << 21}, {1_572_864, 1 << 21}, {1_572_865, 1 << 22},
	} {
		if got := slotsFor(tc.n); got != tc.want {
			t.Errorf("slotsFor(%d) = %d, want %d", tc.n, got, tc.want)
		}
	}
}

// A table sized for n holds n without growing (Presize, Reserve).
func TestTablePresizedNeverGrows(t *testing.T) {
	const n = 100_000
	tb := newTable(n)
	size := len(tb.slots)
	r := newRand(3)
	for i := range n {
		tb.insert(r.Uint64(), int32(i))
	}
	if len(tb.slots) != size || tb.old != nil {
		t.Fatalf("grew from %d to %d slots", size, len(tb.slots))
	}
}

// A presized index and one reset to a Reserved table never grow their
// table up to their ceiling; without either, the table grows as it fills.
func TestIndexTableSizing(t *testing.T) {
	const ceiling = 50_000
	for _, tc := range []struct {
		name  string
		index func() *Index
		grows bool
	}{
		{"presized", func() *Index { return New(Options{MaxEntries: ceiling, Presize: true}) }, false},
		{"reserved", func() *Index {
			x := New(Options{MaxEntries: ceiling})
			x.ResetTo(Reserve(ceiling))
			return x
		}, false},
		{"growing", func() *Index { return New(Options{MaxEntries: ceiling}) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := tc.index()
			size := len(x.byHash.slots)
			r := newRand(5)
			first := make([]uint64, 50)
			for i := range first {
				first[i] = r.Uint64()
			}
			x.Insert(first, 1, 1)
			p := make([]uint64, 50)
			migrating := 0
			for x.Len() < ceiling {
				for i := range p {
					p[i] = r.Uint64()
				}
				x.Insert(p, 1, 1)
				if x.byHash.old != nil {
					// The first path's entries are in the old array.
					migrating++
					if n := x.HeldPrefix(first, 1); n != len(first) {
						t.Fatalf("while growing: %d of the first path's %d blocks found", n, len(first))
					}
				}
			}
			if grew := len(x.byHash.slots) != size; grew != tc.grows || grew && migrating == 0 {
				t.Fatalf("table of %d slots grew to %d: %v (%d inserts while migrating), want %v", size, len(x.byHash.slots), grew, migrating, tc.grows)
			}
			checkInvariants(t, x)
		})
	}
}

// Growth keeps every key, also while both arrays are in use and keys are
// deleted from the old one, and whatever the migration's pace (step 1
// falls behind the next growth, which then finishes it at once).
func TestTableGrowKeepsEveryKey(t *testing.T) {
	for _, step := range []int{1, 3, migrateStep} {
		t.Run(fmt.Sprintf("step=%d", step), func(t *testing.T) {
			tb := newTable(0)
			tb.step = step
			r := newRand(uint64(step))
			const n = 20_000
			keys := make([]uint64, n)
			keyOf := func(v int32) uint64 { return keys[v] }
			live := map[int32]bool{}
			grows, migrating := 0, 0
			for i := range keys {
				keys[i] = r.Uint64()
				size := len(tb.slots)
				tb.insert(keys[i], int32(i))
				live[int32(i)] = true
				if len(tb.slots) != size {
					grows++
				}
				if tb.old != nil {
					migrating++
				}
				if i%3 == 2 { // delete a random live key, maybe from old
					v := int32(r.IntN(i + 1))
					if tb.remove(keys[v], v) != live[v] {
						t.Fatalf("remove %d: live %v", v, live[v])
					}
					delete(live, v)
				}
				if i%997 == 0 || tb.old != nil && i%7 == 0 {
					if err := tableErr(&tb); err != nil {
						t.Fatalf("after %d inserts: %v", i+1, err)
					}
				}
			}
			if grows < 10 || migrating == 0 {
				t.Fatalf("%d growths, %d inserts while migrating: growth not exercised", grows, migrating)
			}
			if tb.len() != len(live) {
				t.Fatalf("len %d, want %d", tb.len(), len(live))
			}
			for i, k := range keys {
				v, ok := get(&tb, keyOf, k)
				if ok != live[int32(i)] || ok && v != int32(i) {
					t.Fatalf("key %d: got %d, %v; live %v", i, v, ok, live[int32(i)])
				}
			}
		})
	}
}

// FuzzTable runs random inserts, removes and lookups against a Go map.
// Keys come from a byte: with the identity mix (k0 = 0, k1 = 1) their homes
// are the byte's top bits, so small arrays get long runs that wrap around
// the end, and bytes that differ in their two low bits share a fingerprint.
func FuzzTable(f *testing.F) {
	f.Add(uint64(0), uint64(1), uint8(1), []byte{0, 0xe0, 0, 0xe1, 0, 0x00, 0, 0x20, 1, 0xe0, 2, 0x00, 1, 0x00})
	f.Add(uint64(0), uint64(1), uint8(0), []byte("the quick brown fox jumps over the lazy dog, again and again"))
	f.Add(uint64(0x9e3779b97f4a7c15), uint64(0xbf58476d1ce4e5b9), uint8(2), []byte("0123456789abcdefghijklmnopqrstuvwxyz"))
	f.Fuzz(func(t *testing.T, k0, k1 uint64, step uint8, ops []byte) {
		runTableOps(t, k0, k1, int(step%4)+1, ops)
	})
}

// Fuzz seeds only cover so much: the same check over longer random runs.
func TestTableMatchesMap(t *testing.T) {
	for seed := range uint64(20) {
		r := newRand(seed)
		ops := make([]byte, 2000)
		for i := range ops {
			ops[i] = byte(r.Uint32())
		}
		k0, k1 := r.Uint64(), r.Uint64()
		if seed%2 == 1 { // the identity mix: long, wrapping runs
			k0, k1 = 0, 1
		}
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			runTableOps(t, k0, k1, int(seed%4)+1, ops)
		})
	}
}

func runTableOps(t *testing.T, k0, k1 uint64, step int, ops []byte) {
	t.Helper()
	tb := newTable(0)
	tb.k0, tb.k1, tb.step = k0, k1|1, step
	key := func(b byte) uint64 { return uint64(b>>2)<<58 | uint64(b&3) }
	keyOf := func(v int32) uint64 { return key(byte(v)) }
	want := map[uint64]int32{}
	for i := 0; i+1 < len(ops); i += 2 {
		b := ops[i+1]
		k := key(b)
		_, in := want[k]
		switch ops[i] % 3 {
		case 0:
			if !in {
				tb.insert(k, int32(b))
				want[k] = int32(b)
			}
		case 1:
			if tb.remove(k, int32(b)) != in {
				t.Fatalf("op %d: remove %#x reported %v, want %v", i/2, k, !in, in)
			}
			delete(want, k)
		}
		if err := tableErr(&tb); err != nil {
			t.Fatalf("op %d: %v", i/2, err)
		}
		for c := range 256 {
			k := key(byte(c))
			v, ok := get(&tb, keyOf, k)
			w, in := want[k]
			if ok != in || v != w {
				t.Fatalf("op %d: get %#x = %d, %v; want %d, %v", i/2, k, v, ok, w, in)
			}
		}
	}
}

// A Reserved not made by Reserve (the zero value) resets to a fresh,
// growing table rather than an unusable one.
func TestResetToZeroReserved(t *testing.T) {
	x := New(Options{MaxEntries: 100})
	x.Insert([]uint64{1, 2}, 1, 1)
	x.ResetTo(&Reserved{})
	x.Insert([]uint64{3, 4, 5}, 1, 2)
	if x.Len() != 3 || x.HeldPrefix([]uint64{3, 4, 5}, 1) != 3 {
		t.Fatalf("after the reset: %d entries, held %d", x.Len(), x.HeldPrefix([]uint64{3, 4, 5}, 1))
	}
	checkInvariants(t, x)
}

// A presized index reset without a Reserved keeps its table's array,
// emptied, so a refill does not grow it; an index that was not presized
// starts a fresh, growing table.
func TestResetKeepsAPresizedTable(t *testing.T) {
	for _, presize := range []bool{true, false} {
		x := New(Options{MaxEntries: 10_000, Presize: presize})
		r := newRand(9)
		p := make([]uint64, 40)
		for range 100 {
			for i := range p {
				p[i] = r.Uint64()
			}
			x.Insert(p, 1, 1)
		}
		arr := &x.byHash.slots[0]
		size := len(x.byHash.slots)
		x.Reset()
		if x.Len() != 0 || x.byHash.len() != 0 {
			t.Fatalf("presize %v: %d entries after Reset", presize, x.Len())
		}
		if kept := &x.byHash.slots[0] == arr; kept != presize {
			t.Fatalf("presize %v: array kept %v", presize, kept)
		}
		if presize && len(x.byHash.slots) != size {
			t.Fatalf("presized table of %d slots is %d after Reset", size, len(x.byHash.slots))
		}
		if n := x.HeldPrefix(p, 1); n != 0 {
			t.Fatalf("presize %v: %d blocks of a dropped path still held", presize, n)
		}
		x.Insert(p, 2, 2)
		if n := x.HeldPrefix(p, 2); n != len(p) {
			t.Fatalf("presize %v: %d of %d blocks held after the refill", presize, n, len(p))
		}
		checkInvariants(t, x)
	}
}
