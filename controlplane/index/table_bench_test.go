package index

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
)

// benchFind is Index.find over a keys slice standing in for the slab: the
// table's lookups pay the read of the candidate's key, which the index
// reads anyway on a hit (the map keeps its own copy of the key).
func benchFind(t *table, keys []uint64, h uint64) (int32, bool) {
	for c := t.probe(h); ; {
		v, ok := t.next(&c)
		if !ok {
			return 0, false
		}
		if keys[v] == h {
			return v, true
		}
	}
}

// BenchmarkTable compares the table with a Go map, both sized for their
// entries up front as a control-plane index is (Options.Presize), with
// random 64-bit keys: lookups of present and absent keys, inserts into an
// empty table up to size (delete: from full down to empty; the refill or
// reset between rounds is not timed), and churn, a delete plus an insert at
// full size (the index's steady state: each new block evicts one).
//
//	go test -run '^$' -bench 'Table$' -benchmem ./controlplane/index/
func BenchmarkTable(b *testing.B) {
	for _, size := range benchSizes {
		keys := make([]uint64, 2*size)
		r := newRand(uint64(size))
		for i := range keys {
			keys[i] = r.Uint64()
		}
		for _, impl := range []string{"table", "map"} {
			name := func(op string) string {
				return fmt.Sprintf("entries=%s/%s/%s", testkit.SizeName(size), op, impl)
			}
			var t table
			var m map[uint64]int32
			fill := func() {
				t, m = newTable(size), make(map[uint64]int32, size)
				for i, k := range keys[:size] {
					if impl == "table" {
						t.insert(k, int32(i))
					} else {
						m[k] = int32(i)
					}
				}
			}
			b.Run(name("hit"), func(b *testing.B) {
				fill()
				settle()
				b.ReportAllocs()
				i, found := 0, 0
				for b.Loop() {
					k := keys[i]
					if impl == "table" {
						if _, ok := benchFind(&t, keys, k); ok {
							found++
						}
					} else if _, ok := m[k]; ok {
						found++
					}
					if i++; i == size {
						i = 0
					}
				}
				if found != b.N {
					b.Fatalf("found %d of %d", found, b.N)
				}
			})
			b.Run(name("miss"), func(b *testing.B) {
				fill()
				settle()
				b.ReportAllocs()
				i, found := size, 0
				for b.Loop() {
					k := keys[i]
					if impl == "table" {
						if _, ok := benchFind(&t, keys, k); ok {
							found++
						}
					} else if _, ok := m[k]; ok {
						found++
					}
					if i++; i == len(keys) {
						i = size
					}
				}
				if found != 0 {
					b.Fatalf("found %d absent keys", found)
				}
			})
			b.Run(name("insert"), func(b *testing.B) {
				t, m = newTable(size), make(map[uint64]int32, size)
				settle()
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					if i == size {
						b.StopTimer()
						clear(t.slots)
						t.n = 0
						clear(m)
						i = 0
						b.StartTimer()
					}
					if impl == "table" {
						t.insert(keys[i], int32(i))
					} else {
						m[keys[i]] = int32(i)
					}
					i++
				}
			})
			b.Run(name("delete"), func(b *testing.B) {
				fill()
				settle()
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					if i == size {
						b.StopTimer()
						fill()
						i = 0
						b.StartTimer()
					}
					if impl == "table" {
						t.remove(keys[i], int32(i))
					} else {
						delete(m, keys[i])
					}
					i++
				}
			})
			b.Run(name("churn"), func(b *testing.B) {
				fill()
				settle()
				b.ReportAllocs()
				// keys[old] is the oldest entry, keys[old+size] the next new
				// one, wrapping around the ring of 2*size keys.
				old := 0
				for b.Loop() {
					nw := (old + size) % len(keys)
					if impl == "table" {
						t.remove(keys[old], int32(old))
						t.insert(keys[nw], int32(nw))
					} else {
						delete(m, keys[old])
						m[keys[nw]] = int32(nw)
					}
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
// the CPU time of the slowest single insert, the lock hold growth adds:
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
			for b.Loop() {
				t, m := newTable(0), map[uint64]int32{}
				if mode == "at-once" {
					t.step = math.MaxInt
				}
				runtime.GC()
				for i, k := range keys {
					c := testkit.ThreadCPU()
					if mode == "map" {
						m[k] = int32(i)
					} else {
						t.insert(k, int32(i))
					}
					cpu = append(cpu, testkit.ThreadCPU()-c)
				}
			}
			slices.Sort(cpu)
			b.ReportMetric(float64(cpu[len(cpu)/2].Nanoseconds())/1e3, "cpu-p50-µs")
			b.ReportMetric(float64(cpu[len(cpu)*9999/10000].Nanoseconds())/1e3, "cpu-p99.99-µs")
			b.ReportMetric(float64(cpu[len(cpu)-1].Nanoseconds())/1e3, "cpu-max-µs")
		})
	}
}
