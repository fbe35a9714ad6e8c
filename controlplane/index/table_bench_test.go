package index

import (
	"fmt"
	"math"
	"math/bits"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
)

// benchFind is Index.find over slab, a slice standing in for the index's
// slab (the key of each value): the table confirms a candidate by reading
// the key there, as the index reads the entry anyway on a hit.
func benchFind(t *table, slab []uint64, h uint64) (int32, bool) {
	m := t.mix(h)
	a, fp := t.slots, m>>32
	mask := uint64(len(a) - 1)
	for i := m >> t.shift; ; i++ {
		w := a[i&mask]
		if w == 0 {
			return 0, false // never growing here: no old array
		}
		if w>>32 == fp {
			if v := int32(uint32(w)) - 1; slab[v] == h {
				return v, true
			}
		}
	}
}

// wideTable is the layout the table was measured against: 16-byte slots
// holding the key itself (so a candidate needs no slab read), with the same
// mix, probing and backward-shift deletion.
type wideTable struct {
	s      []wideSlot
	shift  uint
	k0, k1 uint64
}

type wideSlot struct{ k, v uint64 } // v is the value + 1, 0 when empty

func newWideTable(n int) *wideTable {
	t := newTable(n)
	return &wideTable{s: make([]wideSlot, len(t.slots)), shift: t.shift, k0: t.k0, k1: t.k1}
}

func (t *wideTable) home(h uint64) uint64 {
	hi, lo := bits.Mul64(h^t.k0, t.k1)
	return (hi ^ lo) >> t.shift
}

func (t *wideTable) get(h uint64) (int32, bool) {
	mask := uint64(len(t.s) - 1)
	for i := t.home(h); ; i++ {
		e := &t.s[i&mask]
		if e.v == 0 {
			return 0, false
		}
		if e.k == h {
			return int32(e.v - 1), true
		}
	}
}

func (t *wideTable) insert(h uint64, v int32) {
	mask := uint64(len(t.s) - 1)
	i := t.home(h)
	for t.s[i&mask].v != 0 {
		i++
	}
	t.s[i&mask] = wideSlot{h, uint64(v) + 1}
}

func (t *wideTable) remove(h uint64) {
	mask := uint64(len(t.s) - 1)
	i := t.home(h) & mask
	for t.s[i].k != h || t.s[i].v == 0 {
		if t.s[i].v == 0 {
			return
		}
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; t.s[j].v != 0; j = (j + 1) & mask {
		if (j-t.home(t.s[j].k))&mask >= (j-i)&mask {
			t.s[i] = t.s[j]
			i = j
		}
	}
	t.s[i] = wideSlot{}
}

// BenchmarkTable compares the table with 16-byte slots (wide) and a Go
// map, all sized for their entries up front as a control-plane index is
// (Options.Presize), with random 64-bit keys whose values are a random
// permutation, like slab slots. A hit reads the value's slab entry in every
// layout (the index reads it anyway; the table's key check is that read).
// insert fills an empty table up to size and delete empties a full one (the
// reset or refill between rounds is not timed); churn is a delete and an
// insert at full size, the index's steady state (each new block evicts one).
//
//	go test -run '^$' -bench 'Table$' -benchmem ./controlplane/index/
func BenchmarkTable(b *testing.B) {
	for _, size := range benchSizes {
		r := newRand(uint64(size))
		keys := make([]uint64, 2*size)
		for i := range keys {
			keys[i] = r.Uint64()
		}
		vals := make([]int32, len(keys))
		slab := make([]uint64, len(keys))
		for i, v := range r.Perm(len(keys)) {
			vals[i] = int32(v)
			slab[v] = keys[i]
		}
		for kind, impl := range []string{"table", "wide", "map"} {
			name := func(op string) string {
				return fmt.Sprintf("entries=%s/%s/%s", testkit.SizeName(size), op, impl)
			}
			var t table
			var w *wideTable
			var m map[uint64]int32
			empty := func() { t, w, m = newTable(size), newWideTable(size), make(map[uint64]int32, size) }
			add := func(i int) {
				switch kind {
				case 0:
					t.insert(keys[i], vals[i])
				case 1:
					w.insert(keys[i], vals[i])
				default:
					m[keys[i]] = vals[i]
				}
			}
			del := func(i int) {
				switch kind {
				case 0:
					t.remove(keys[i], vals[i])
				case 1:
					w.remove(keys[i])
				default:
					delete(m, keys[i])
				}
			}
			fill := func() {
				empty()
				for i := range size {
					add(i)
				}
			}
			find := func(h uint64) bool {
				switch kind {
				case 0:
					_, ok := benchFind(&t, slab, h)
					return ok
				case 1:
					v, ok := w.get(h)
					return ok && slab[v] == h
				default:
					v, ok := m[h]
					return ok && slab[v] == h
				}
			}
			for _, op := range []string{"hit", "miss"} {
				b.Run(name(op), func(b *testing.B) {
					fill()
					from := 0
					if op == "miss" {
						from = size
					}
					settle()
					b.ReportAllocs()
					i, found := from, 0
					for b.Loop() {
						if find(keys[i]) {
							found++
						}
						if i++; i == from+size {
							i = from
						}
					}
					if (op == "hit") != (found == b.N) || op == "miss" && found != 0 {
						b.Fatalf("%s: found %d of %d", op, found, b.N)
					}
				})
			}
			// cycle runs op on keys 0..size-1 in turn, starting again
			// (untimed) from reset's state after the last.
			cycle := func(op string, reset func(), do func(int)) {
				b.Run(name(op), func(b *testing.B) {
					reset()
					settle()
					b.ReportAllocs()
					i := 0
					for b.Loop() {
						if i == size {
							b.StopTimer()
							reset()
							i = 0
							b.StartTimer()
						}
						do(i)
						i++
					}
				})
			}
			cycle("insert", empty, add)
			cycle("delete", fill, del)
			b.Run(name("churn"), func(b *testing.B) {
				fill()
				settle()
				b.ReportAllocs()
				// keys[old] is the oldest entry, keys[old+size] the next new
				// one, around the ring of 2*size keys.
				old := 0
				for b.Loop() {
					del(old)
					add((old + size) % len(keys))
					if old++; old == len(keys) {
						old = 0
					}
				}
			})
		}
	}
}

// BenchmarkTableLoad measures lookups in 2^21 slots at loads from 7/16 to
// 7/8, to choose the maximum load (see maxLoadNum).
func BenchmarkTableLoad(b *testing.B) {
	const slots = 1 << 21
	for _, load := range []float64{7.0 / 16, 0.6, 0.75, 7.0 / 8} {
		n := int(load * slots)
		keys := make([]uint64, 2*n)
		r := newRand(uint64(n))
		for i := range keys {
			keys[i] = r.Uint64()
		}
		t := newTable(0)
		t.setSlots(make([]uint64, slots))
		for i, k := range keys[:n] {
			t.insert(k, int32(i))
		}
		if len(t.slots) != slots {
			b.Fatalf("grew to %d", len(t.slots))
		}
		for _, op := range []string{"hit", "miss"} {
			b.Run(fmt.Sprintf("load=%.3f/%s", load, op), func(b *testing.B) {
				from := 0
				if op == "miss" {
					from = n
				}
				settle()
				i, found := from, 0
				for b.Loop() {
					if _, ok := benchFind(&t, keys, keys[i]); ok {
						found++
					}
					if i++; i == from+n {
						i = from
					}
				}
				if (op == "hit") != (found == b.N) {
					b.Fatalf("%s: found %d of %d", op, found, b.N)
				}
			})
		}
	}
}

// BenchmarkTableGrow fills a table from empty to 1M entries and reports
// the CPU time of the slowest single insert, the lock hold growth adds, and
// of the slowest insert that doubled the table (cpu-grow-max-µs):
// incremental is the table as it is (each insert moves migrateStep slots);
// at-once rehashes the whole old array in the insert that grows it, as a
// simple table would. The Go map grows incrementally too.
//
//	go test -run '^$' -bench TableGrow -benchtime 3x ./controlplane/index/
func BenchmarkTableGrow(b *testing.B) {
	const n = 1_000_000
	keys := make([]uint64, n)
	r := newRand(9)
	for i := range keys {
		keys[i] = r.Uint64()
	}
	for _, mode := range []string{"incremental", "at-once", "map"} {
		b.Run(mode, func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var cpu []time.Duration
			var growMax time.Duration // the inserts that doubled the table
			for b.Loop() {
				t, m := newTable(0), map[uint64]int32{}
				if mode == "at-once" {
					t.step = math.MaxInt
				}
				runtime.GC()
				for i, k := range keys {
					size := len(t.slots)
					c := testkit.ThreadCPU()
					if mode == "map" {
						m[k] = int32(i)
					} else {
						t.insert(k, int32(i))
					}
					d := testkit.ThreadCPU() - c
					cpu = append(cpu, d)
					if len(t.slots) != size {
						growMax = max(growMax, d)
					}
				}
			}
			slices.Sort(cpu)
			b.ReportMetric(float64(cpu[len(cpu)/2].Nanoseconds())/1e3, "cpu-p50-µs")
			b.ReportMetric(float64(cpu[len(cpu)*9999/10000].Nanoseconds())/1e3, "cpu-p99.99-µs")
			b.ReportMetric(float64(cpu[len(cpu)-1].Nanoseconds())/1e3, "cpu-max-µs")
			if mode != "map" {
				b.ReportMetric(float64(growMax.Nanoseconds())/1e3, "cpu-grow-max-µs")
			}
		})
	}
}
