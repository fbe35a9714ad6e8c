package index

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/cartrouter/cart/internal/testkit"
)

// BenchmarkHotPathCPU is the routing path's index work on a full 1M-entry
// index in CPU time of the benchmark thread (cpu-ns/op), which a shared,
// busy box disturbs far less than wall time: a lookup of a prompt fully
// in the index, a refresh of a known path, and an insert of a new path
// (evicting as many entries inline). No frozen view is alive: this is the
// steady-state price of the copy-on-write slab.
func BenchmarkHotPathCPU(b *testing.B) {
	for _, n := range []int{1_000, 10_000} {
		b.Run(fmt.Sprintf("lookup/chars=%s", testkit.SizeName(n)), func(b *testing.B) {
			x := benchIndex(b, 1_000_000)
			p := Hash(nil, "bench-model", benchText(n, uint64(n)+21), benchBlockChars)
			x.Insert(p, 3, 1<<40)
			var m Match
			cpuLoop(b, func(uint64) { x.Lookup(p, &m) })
		})
		b.Run(fmt.Sprintf("refresh/chars=%s", testkit.SizeName(n)), func(b *testing.B) {
			x := benchIndex(b, 1_000_000)
			p := Hash(nil, "bench-model", benchText(n, uint64(n)+22), benchBlockChars)
			x.Insert(p, 3, 1<<40)
			cpuLoop(b, func(i uint64) { x.Insert(p, 3, int64(1<<40+i)) })
		})
		b.Run(fmt.Sprintf("new/chars=%s", testkit.SizeName(n)), func(b *testing.B) {
			x := benchIndex(b, 1_000_000)
			base := Hash(nil, "bench-model", benchText(n, uint64(n)+23), benchBlockChars)
			p := make([]uint64, len(base))
			cpuLoop(b, func(i uint64) {
				for j, h := range base {
					p[j] = h ^ ((i + 1<<42) * 0x9e3779b97f4a7c15)
				}
				x.Insert(p, WorkerID(i%8), int64(1<<42+i))
			})
		})
	}
}

func cpuLoop(b *testing.B, f func(i uint64)) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	settle()
	b.ReportAllocs()
	cpu := testkit.ThreadCPU()
	var i uint64
	for b.Loop() {
		f(i)
		i++
	}
	b.ReportMetric(float64((testkit.ThreadCPU()-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
}
