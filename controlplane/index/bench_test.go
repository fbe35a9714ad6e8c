package index

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
)

const benchBlockChars = 128 // the default cache.block_chars

var (
	benchSizes   = []int{10_000, 1_000_000}
	benchPrompts = []int{1_000, 10_000, 100_000}
)

// benchIndexes caches the pre-filled indexes across sub-benchmarks: the
// 1M-entry one takes a while to build.
var benchIndexes struct {
	sync.Mutex
	m map[int]*Index
}

// benchIndex returns a shared index holding n entries (random paths of 100
// blocks over 8 workers). It evicts inline, so sub-benchmarks may insert
// their own prompts without growing it.
func benchIndex(b *testing.B, n int) *Index {
	benchIndexes.Lock()
	defer benchIndexes.Unlock()
	if benchIndexes.m == nil {
		benchIndexes.m = map[int]*Index{}
	}
	x, ok := benchIndexes.m[n]
	if !ok {
		x = fillIndex(Options{MaxEntries: n, InlineEvict: true}, n, 100, 8, 99)
		benchIndexes.m[n] = x
	}
	return x
}

func benchText(n int, seed uint64) []byte { return testkit.PrintableText(n, newRand(seed)) }

func BenchmarkHash(b *testing.B) {
	for _, n := range benchPrompts {
		b.Run(fmt.Sprintf("chars=%s", testkit.SizeName(n)), func(b *testing.B) {
			text := benchText(n, 1)
			dst := make([]uint64, 0, NumBlocks(n, benchBlockChars))
			b.SetBytes(int64(n))
			settle()
			b.ReportAllocs()
			for b.Loop() {
				dst = Hash(dst[:0], "bench-model", text, benchBlockChars)
			}
		})
	}
}

// BenchmarkLookup matches a prompt that is fully in the index (the longest
// walk) against pre-filled indexes.
func BenchmarkLookup(b *testing.B) {
	for _, size := range benchSizes {
		for _, n := range benchPrompts {
			b.Run(fmt.Sprintf("entries=%s/chars=%s", testkit.SizeName(size), testkit.SizeName(n)), func(b *testing.B) {
				x := benchIndex(b, size)
				p := Hash(nil, "bench-model", benchText(n, uint64(n)), benchBlockChars)
				x.Insert(p, 3, 1<<40)
				x.Insert(p[:len(p)/2], 5, 1<<40) // a second, shorter holder
				var m Match
				x.Lookup(p, &m)
				settle()
				b.ReportAllocs()
				for b.Loop() {
					x.Lookup(p, &m)
				}
				if m.Longest != len(p) || m.BlocksFor(3) != len(p) {
					b.Fatalf("prompt not fully matched: %d of %d", m.Longest, len(p))
				}
			})
		}
	}
}

// BenchmarkLookupCold matches prompts of 16 blocks (a 2k-character shared
// prefix) that a 1M-entry index holds, a different one each time out of
// 20,000, so that their entries are not in the processor's cache as they
// are in BenchmarkLookup, where one prompt is matched over and over: the
// control plane's case, where every route matches another prompt.
//
//	go test -run '^$' -bench LookupCold ./controlplane/index/
func BenchmarkLookupCold(b *testing.B) {
	const prompts, blocks = 20_000, 16
	x := benchIndex(b, 1_000_000)
	r := newRand(31)
	paths := make([][]uint64, prompts)
	for i := range paths {
		paths[i] = make([]uint64, blocks)
		for j := range paths[i] {
			paths[i][j] = r.Uint64()
		}
		x.Insert(paths[i], WorkerID(i%8), 1<<43)
	}
	var m Match
	matched := 0
	settle()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		x.Lookup(paths[i%prompts], &m)
		if m.Longest == blocks {
			matched++
		}
	}
	if matched != b.N {
		b.Fatalf("%d of %d lookups matched the whole prompt", matched, b.N)
	}
}

// BenchmarkInsert measures recording a prompt: refresh of a known path and
// a path of new entries into a full index (inline eviction).
func BenchmarkInsert(b *testing.B) {
	for _, size := range benchSizes {
		for _, n := range benchPrompts {
			name := fmt.Sprintf("entries=%s/chars=%s", testkit.SizeName(size), testkit.SizeName(n))
			b.Run("refresh/"+name, func(b *testing.B) {
				x := benchIndex(b, size)
				p := Hash(nil, "bench-model", benchText(n, uint64(n)), benchBlockChars)
				x.Insert(p, 3, 1<<40)
				settle()
				b.ReportAllocs()
				for i := int64(0); b.Loop(); i++ {
					x.Insert(p, 3, 1<<40+i)
				}
			})
			b.Run("new/"+name, func(b *testing.B) {
				x := benchIndex(b, size)
				base := Hash(nil, "bench-model", benchText(n, uint64(n)+7), benchBlockChars)
				p := make([]uint64, len(base))
				settle()
				b.ReportAllocs()
				for i := uint64(1); b.Loop(); i++ {
					for j, h := range base {
						p[j] = h ^ (i * 0x9e3779b97f4a7c15)
					}
					x.Insert(p, WorkerID(i%8), int64(1<<41+i))
				}
				if x.Len() != size {
					b.Fatalf("len %d", x.Len())
				}
			})
		}
	}
}

// BenchmarkMemoryPerEntry builds a 1M-entry index per iteration and reports
// the live heap it takes per entry (slab, map and LRU links included).
func BenchmarkMemoryPerEntry(b *testing.B) {
	var bpe float64
	for b.Loop() {
		bpe = measureBytesPerEntry(1_000_000)
	}
	b.ReportMetric(bpe, "B/entry")
}

// settle finishes the garbage collection that building a large index
// leaves running, so it does not steal time from the measured loop.
func settle() { runtime.GC() }

// BenchmarkFreeze measures what a snapshot does under the routing lock: a
// copy of the page table (one pointer per 64 entries).
func BenchmarkFreeze(b *testing.B) {
	x := benchIndex(b, 1_000_000)
	cpuLoop(b, func(uint64) { x.Freeze().Release() })
}

// BenchmarkInsertAfterFreeze measures the price of copy on write: the
// first inserts after a freeze copy the pages they touch while
// a view is alive. Each op is a freeze followed by 256 inserts of new
// prompts into a full 1M-entry index. Times are CPU time of the inserting
// thread (on a shared box wall time measures the neighbours): cpu-ns/insert
// on average, max-cpu-µs for the slowest single insert, the longest it
// makes a lock hold. frozen=false runs the same inserts with no view
// alive, for comparison.
func BenchmarkInsertAfterFreeze(b *testing.B) {
	for _, n := range []int{1_000, 10_000} {
		for _, frozen := range []bool{false, true} {
			b.Run(fmt.Sprintf("chars=%s/frozen=%v", testkit.SizeName(n), frozen), func(b *testing.B) {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				x := benchIndex(b, 1_000_000)
				base := Hash(nil, "bench-model", benchText(n, uint64(n)+11), benchBlockChars)
				p := make([]uint64, len(base))
				var worst, total time.Duration
				settle()
				b.ReportAllocs()
				i := uint64(1 << 40)
				for b.Loop() {
					var v *View
					if frozen {
						v = x.Freeze()
					}
					for range 256 {
						i++
						for j, h := range base {
							p[j] = h ^ (i * 0x9e3779b97f4a7c15)
						}
						cpu := testkit.ThreadCPU()
						x.Insert(p, WorkerID(i%8), int64(i))
						d := testkit.ThreadCPU() - cpu
						worst, total = max(worst, d), total+d
					}
					if v != nil {
						v.Release()
					}
				}
				b.ReportMetric(float64(total.Nanoseconds())/float64(256*b.N), "cpu-ns/insert")
				b.ReportMetric(float64(worst.Microseconds()), "max-cpu-µs")
			})
		}
	}
}

// BenchmarkEvictStep measures one bounded eviction step (the maintenance
// loop's lock hold) on a full 1M-entry index, with and without a frozen
// view alive (a snapshot being written makes the step copy pages), in CPU
// time of the evicting thread.
func BenchmarkEvictStep(b *testing.B) {
	for _, chunk := range []int{128, 2048} {
		for _, frozen := range []bool{false, true} {
			b.Run(fmt.Sprintf("chunk=%d/frozen=%v", chunk, frozen), func(b *testing.B) {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				x := fillIndex(Options{MaxEntries: 1_000_000 + chunk, InlineEvict: true}, 1_000_000+chunk, 100, 8, 5)
				r := newRand(6)
				p := make([]uint64, chunk)
				var worst, total time.Duration
				settle()
				b.ReportAllocs()
				for b.Loop() {
					var v *View
					if frozen {
						v = x.Freeze()
					}
					cpu := testkit.ThreadCPU()
					x.Evict(1_000_000, chunk)
					d := testkit.ThreadCPU() - cpu
					worst, total = max(worst, d), total+d
					b.StopTimer()
					if v != nil {
						v.Release()
					}
					for j := range p {
						p[j] = r.Uint64()
					}
					x.Insert(p, 1, 1)
					b.StartTimer()
				}
				b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "cpu-ns/step")
				b.ReportMetric(float64(worst.Microseconds()), "max-cpu-µs")
			})
		}
	}
}

// BenchmarkInsertWhileGrowing measures inserts into an index filling up
// from empty to 1M entries (paths of 40 new blocks, as a new prompt's
// tail), in CPU time per Insert, with and without a presized hash map.
//
//	go test -run '^$' -bench InsertWhileGrowing -benchtime 1x ./controlplane/index/
func BenchmarkInsertWhileGrowing(b *testing.B) {
	for _, presize := range []bool{false, true} {
		b.Run(fmt.Sprintf("presize=%v", presize), func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var cpu []time.Duration
			p := make([]uint64, 40)
			for b.Loop() {
				b.StopTimer()
				x := New(Options{MaxEntries: 1_000_000, Presize: presize})
				r := newRand(7)
				runtime.GC()
				b.StartTimer()
				for i := range 1_000_000 / len(p) {
					for j := range p {
						p[j] = r.Uint64()
					}
					c := testkit.ThreadCPU()
					x.Insert(p, WorkerID(i%4), int64(i))
					cpu = append(cpu, testkit.ThreadCPU()-c)
				}
			}
			slices.Sort(cpu)
			b.ReportMetric(float64(cpu[len(cpu)/2].Nanoseconds())/1e3, "cpu-p50-µs")
			b.ReportMetric(float64(cpu[len(cpu)*99/100].Nanoseconds())/1e3, "cpu-p99-µs")
			b.ReportMetric(float64(cpu[len(cpu)-1].Nanoseconds())/1e3, "cpu-max-µs")
		})
	}
}
