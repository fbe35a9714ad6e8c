package decider

import (
	"context"
	"runtime"
)

// seedChunk bounds the index entries one seed step visits (it adds a
// quarter as many holdings to a model). Measured on a full 1M-entry index
// with 8 workers all seeding at once (BenchmarkSeedStep in
// controlplane/engine, CPU time on a busy 2-core box): 1,024 held the lock
// 133-195 µs at p99 and 725-834 µs at most; 2,048 reached 1.2-1.3 ms; the
// one-shot walk it replaces held it 59-93 ms.
const seedChunk = 1024

// SeedModels runs the seeding of cache models (engine.SeedStep: a worker's
// first KV report when nobody modelled it) to its end, in short lock
// holds; the ordering of each worker's collected holdings runs outside
// the lock. trim gets the eviction trims a seed deferred, outside the
// lock, to apply as ApplyKVReport's answers are. Several callers may run
// it at once: they share the steps. It returns early when ctx ends (a
// leader stepping down); the seed stays where it was, for the next caller.
func (d *Decider) SeedModels(ctx context.Context, trim func(url string, hashes []uint64)) {
	for ctx.Err() == nil {
		t := d.lock()
		r := d.eng.SeedStep(seedChunk)
		d.unlock(OpSeed, t)
		for _, tr := range r.Trims {
			trim(tr.URL, tr.Hashes)
		}
		if len(r.Sorts) > 0 {
			for _, j := range r.Sorts {
				j.Sort()
			}
			t := d.lock()
			d.eng.SeedSorted(r.Sorts)
			d.unlock(OpSeed, t)
			runtime.Gosched()
			continue
		}
		if !r.More {
			return
		}
		// As in Steps: let a waiting decision take the lock first.
		runtime.Gosched()
	}
}

// Seeder runs SeedModels on a loop of its own, woken by Wake, so that the
// goroutine that finds a worker to seed (a KV report's stream) is never
// held up by the seed: over a full index it takes most of a second,
// during which that stream would read nothing. The control-plane leader
// and the all-in-one router both seed through one.
type Seeder struct {
	d    *Decider
	trim func(url string, hashes []uint64)
	wake chan struct{}
}

// NewSeeder returns a Seeder over d; trim is SeedModels'.
func (d *Decider) NewSeeder(trim func(url string, hashes []uint64)) *Seeder {
	return &Seeder{d: d, trim: trim, wake: make(chan struct{}, 1)}
}

// Wake asks the loop for a seeding run, without waiting for it. Wakes
// while a run is in progress add up to one more run, which finds
// whatever seed they started.
func (s *Seeder) Wake() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Run seeds each time it is woken until ctx ends, and ends a run in
// progress between two steps then (the seed stays where it was, for the
// next Run). A wake before Run started is served once it does.
func (s *Seeder) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
			s.d.SeedModels(ctx, s.trim)
		}
	}
}
