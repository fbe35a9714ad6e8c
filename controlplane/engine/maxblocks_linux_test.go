package engine

import (
	"fmt"
	"syscall"
	"testing"

	"github.com/cartrouter/cart/controlplane/index"
)

// cpuNanos is the process's CPU time. On a shared machine wall time per
// operation mostly measures the neighbours; CPU time measures the work.
// The benchmarks below allocate nothing, so GC adds little to it.
func cpuNanos() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// BenchmarkRouteMaxBlocks is the longest decision the engine makes: a
// prompt of MaxRouteBlocks blocks (64k characters at 64 per block), and of
// a quarter and half of it, in a full index of 1M entries, as a hit
// (lookup and refresh) and as a miss (all blocks new, evicting as many).
func BenchmarkRouteMaxBlocks(b *testing.B) {
	for _, blocks := range []int{MaxRouteBlocks / 4, MaxRouteBlocks / 2, MaxRouteBlocks} {
		b.Run(fmt.Sprintf("blocks=%d", blocks), func(b *testing.B) { benchRouteBlocks(b, blocks) })
	}
}

func benchRouteBlocks(b *testing.B, blocks int) {
	n := blocks * benchBlockChars
	b.Run("hit", func(b *testing.B) {
		e := benchEngine(1_000_000)
		r := Request{Hashes: index.Hash(nil, "bench-model", benchText(n, 5), benchBlockChars), KeyLen: n}
		d, _ := e.Choose(r, 1<<40)
		e.Release(d.Worker)
		b.ReportAllocs()
		cpu := cpuNanos()
		for i := int64(0); b.Loop(); i++ {
			d, _ = e.Choose(r, 1<<40+i)
			e.Release(d.Worker)
		}
		b.ReportMetric(float64(cpuNanos()-cpu)/float64(b.N), "cpu-ns/op")
		if d.Reason != ReasonCacheHit {
			b.Fatalf("decision %v", d)
		}
	})
	b.Run("miss", func(b *testing.B) {
		e := benchEngine(1_000_000)
		base := index.Hash(nil, "bench-model", benchText(n, 6), benchBlockChars)
		r := Request{Hashes: make([]uint64, len(base)), KeyLen: n}
		var d Decision
		b.ReportAllocs()
		cpu := cpuNanos()
		for i := uint64(1); b.Loop(); i++ {
			for j, h := range base {
				r.Hashes[j] = h ^ (i * 0x9e3779b97f4a7c15)
			}
			d, _ = e.Choose(r, int64(1<<41+i))
			e.Release(d.Worker)
		}
		b.ReportMetric(float64(cpuNanos()-cpu)/float64(b.N), "cpu-ns/op")
		if d.Reason != ReasonCacheMiss {
			b.Fatalf("decision %v", d)
		}
	})
}
