package engine

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"

	"github.com/cartrouter/cart/controlplane/index"
	"github.com/cartrouter/cart/internal/testkit"
)

const (
	benchBlockChars = 128 // the default cache.block_chars
	benchWorkers    = 8
)

var (
	benchSizes   = []int{10_000, 1_000_000}
	benchPrompts = []int{1_000, 10_000, 100_000}
)

// benchIndexes caches the pre-filled indexes across sub-benchmarks.
var benchIndexes struct {
	sync.Mutex
	m map[int]*index.Index
}

// benchIndex returns a shared index of n entries: random paths of 100
// blocks held round-robin by worker IDs 0..7, which are the IDs a fresh
// engine gives its first 8 workers. It evicts inline so a benchmark that
// inserts new prompts keeps it at n entries.
func benchIndex(n int) *index.Index {
	benchIndexes.Lock()
	defer benchIndexes.Unlock()
	if benchIndexes.m == nil {
		benchIndexes.m = map[int]*index.Index{}
	}
	if x, ok := benchIndexes.m[n]; ok {
		return x
	}
	x := index.New(index.Options{MaxEntries: n, InlineEvict: true})
	r := rand.New(rand.NewPCG(99, 100))
	p := make([]uint64, 100)
	for i := 0; x.Len() < n; i++ {
		k := min(len(p), n-x.Len())
		for j := range k {
			p[j] = r.Uint64()
		}
		x.Insert(p[:k], index.WorkerID(i%benchWorkers), int64(i))
	}
	benchIndexes.m[n] = x
	return x
}

func benchEngine(n int) *Engine {
	e := New(Policy{
		Threshold:           0.5,
		MatchAbsThreshold:   2048,
		BalanceAbsThreshold: 4,
		BalanceRelThreshold: 1.5,
		BlockChars:          benchBlockChars,
	}, benchIndex(n), rand.New(rand.NewPCG(1, 2)))
	specs := make([]WorkerSpec, benchWorkers)
	for i := range specs {
		specs[i] = WorkerSpec{URL: fmt.Sprintf("http://worker-%d:8000", i), MaxLoad: 64}
	}
	e.SetWorkers(specs)
	return e
}

func benchText(n int, seed uint64) []byte {
	return testkit.PrintableText(n, rand.New(rand.NewPCG(seed, 0)))
}

// BenchmarkEngineRoute is the full per-request decision (match, decide,
// record, and the Release that follows the response):
//
//   - hit: the prompt is held by one worker (prefix refreshed);
//   - miss: every request is a new prompt (all its blocks are new entries
//     in a full index, evicting as many);
//   - hash+hit: hit, plus hashing the key text as the data plane does.
func BenchmarkEngineRoute(b *testing.B) {
	for _, size := range benchSizes {
		for _, n := range benchPrompts {
			name := fmt.Sprintf("entries=%s/chars=%s", testkit.SizeName(size), testkit.SizeName(n))
			b.Run("hit/"+name, func(b *testing.B) {
				e := benchEngine(size)
				r := Request{Hashes: index.Hash(nil, "bench-model", benchText(n, uint64(n)), benchBlockChars), KeyLen: n}
				warm := r
				warm.Exclude = others(e, "http://worker-3:8000")
				d, _ := e.Choose(warm, 1<<40)
				e.Release(d.Worker)
				settle()
				b.ReportAllocs()
				for i := int64(0); b.Loop(); i++ {
					d, _ = e.Choose(r, 1<<40+i)
					e.Release(d.Worker)
				}
				if d.Reason != ReasonCacheHit {
					b.Fatalf("decision %v", d)
				}
			})
			b.Run("miss/"+name, func(b *testing.B) {
				e := benchEngine(size)
				base := index.Hash(nil, "bench-model", benchText(n, uint64(n)+7), benchBlockChars)
				r := Request{Hashes: make([]uint64, len(base)), KeyLen: n}
				var d Decision
				settle()
				b.ReportAllocs()
				for i := uint64(1); b.Loop(); i++ {
					for j, h := range base {
						r.Hashes[j] = h ^ (i * 0x9e3779b97f4a7c15)
					}
					d, _ = e.Choose(r, int64(1<<41+i))
					e.Release(d.Worker)
				}
				if d.Reason != ReasonCacheMiss {
					b.Fatalf("decision %v", d)
				}
			})
			b.Run("hash+hit/"+name, func(b *testing.B) {
				e := benchEngine(size)
				text := benchText(n, uint64(n)+13)
				r := Request{Hashes: index.Hash(nil, "bench-model", text, benchBlockChars), KeyLen: n}
				d, _ := e.Choose(r, 1<<40)
				e.Release(d.Worker)
				settle()
				b.ReportAllocs()
				for i := int64(0); b.Loop(); i++ {
					r.Hashes = index.Hash(r.Hashes[:0], "bench-model", text, benchBlockChars)
					d, _ = e.Choose(r, 1<<40+i)
					e.Release(d.Worker)
				}
				if d.Reason != ReasonCacheHit {
					b.Fatalf("decision %v", d)
				}
			})
		}
	}
}

// settle finishes the garbage collection that building a large index
// leaves running, so it does not steal time from the measured loop.
func settle() { runtime.GC() }
