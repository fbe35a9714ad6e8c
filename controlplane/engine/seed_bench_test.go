package engine

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
)

// BenchmarkSeedStep compares seeding an unmodelled worker's cache model
// from a full 1M-entry index (8 workers, ~125k holdings each) in one lock
// hold (the one-shot walk it replaces, refSeed) with the stepped seed: the
// longest single step (what routing may wait behind) and the mean, in CPU
// time of the thread and in wall time, and the sort that runs outside the
// lock. seeding=8 is a new leader whose every worker reports at once.
// The maxima are the garbage collector's doing as much as the seed's (a
// step that allocates pays assists while a cycle runs); p99 is the steady
// cost.
//
//	go test -run '^$' -bench SeedStep -benchtime 3x ./controlplane/engine
func BenchmarkSeedStep(b *testing.B) {
	b.Run("one-shot", func(b *testing.B) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var cpu, wall time.Duration
		for b.Loop() {
			b.StopTimer()
			e := benchEngine(1_000_000)
			w := e.workers[3]
			w.kv.on = true
			settle()
			b.StartTimer()
			c, t := testkit.ThreadCPU(), time.Now()
			refSeed(e, w)
			cpu, wall = max(cpu, testkit.ThreadCPU()-c), max(wall, time.Since(t))
			if w.model.len() == 0 {
				b.Fatal("nothing seeded")
			}
		}
		b.ReportMetric(float64(cpu.Microseconds()), "max-cpu-µs/hold")
		b.ReportMetric(float64(wall.Microseconds()), "max-wall-µs/hold")
	})
	for _, seeding := range []int{1, 8} {
		for _, chunk := range []int{1024, 2048, 4096} {
			b.Run(fmt.Sprintf("steps/seeding=%d/chunk=%d", seeding, chunk), func(b *testing.B) {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				var maxCPU, maxWall, total, sorting time.Duration
				var holds []time.Duration
				steps := 0
				for b.Loop() {
					b.StopTimer()
					e := benchEngine(1_000_000)
					for _, w := range e.workers[:seeding] {
						e.ApplyKVReport(w.spec.URL, KVReport{Synced: true}, nil)
					}
					settle()
					b.StartTimer()
					for {
						c, t := testkit.ThreadCPU(), time.Now()
						r := e.SeedStep(chunk)
						d := testkit.ThreadCPU() - c
						maxCPU, maxWall, total = max(maxCPU, d), max(maxWall, time.Since(t)), total+d
						holds = append(holds, d)
						steps++
						if len(r.Sorts) > 0 {
							c := testkit.ThreadCPU()
							for _, j := range r.Sorts {
								j.Sort()
							}
							sorting += testkit.ThreadCPU() - c
							c, t = testkit.ThreadCPU(), time.Now()
							e.SeedSorted(r.Sorts)
							d := testkit.ThreadCPU() - c
							maxCPU, maxWall, total = max(maxCPU, d), max(maxWall, time.Since(t)), total+d
							steps++
							continue
						}
						if !r.More {
							break
						}
					}
					if e.workers[0].model.len() == 0 {
						b.Fatal("nothing seeded")
					}
				}
				b.ReportMetric(float64(maxCPU.Microseconds()), "max-cpu-µs/hold")
				b.ReportMetric(float64(maxWall.Microseconds()), "max-wall-µs/hold")
				b.ReportMetric(float64(total.Microseconds())/float64(steps), "mean-cpu-µs/hold")
				slices.Sort(holds)
				b.ReportMetric(float64(holds[len(holds)*99/100].Microseconds()), "p99-cpu-µs/hold")
				b.ReportMetric(float64(steps)/float64(b.N), "holds/seed")
				b.ReportMetric(float64(sorting.Microseconds())/float64(b.N), "sort-cpu-µs/seed")
			})
		}
	}
}
