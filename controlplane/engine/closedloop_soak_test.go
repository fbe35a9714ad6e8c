package engine

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/cartrouter/cart/controlplane/index"
)

// soakHash is block j of conversation c: distinct per (c, j), and a turn's
// path extends the previous turn's, like a chat that grows.
func soakHash(c, j int) uint64 {
	x := uint64(c)<<20 | uint64(j) + 0x9e3779b97f4a7c15
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// A long run with the closed loop on and no declared capacity, the way the
// control plane drives the engine: route, report usage (mostly confirmed
// predictions, some misses), periodic eviction passes. Before the models
// followed the index, each model kept every block ever routed to its
// worker and confirmed predictions grew its limit by 1% + 1 without end:
// heap grew with the request count while the index stayed at its bound.
func TestClosedLoopSoakModelsStayWithinIndex(t *testing.T) {
	requests := 200_000
	if raceEnabled || testing.Short() {
		requests = 40_000
	}
	const (
		maxEntries = 4096
		turns      = 4 // per conversation
		blocksTurn = 4 // new blocks per turn
		evictEvery = 256
		step       = int64(3e9) // per request: every prediction is old enough to judge
	)
	pol := testPolicy()
	pol.ClosedLoop = true
	const ceiling = maxEntries + maxEntries/8
	idx := index.New(index.Options{MaxEntries: maxEntries, Headroom: ceiling - maxEntries})
	e := New(pol, idx, rand.New(rand.NewPCG(7, 8)))
	e.SetWorkers(urls("a", "b", "c", "d"))
	// The first violation is kept and reported after the heap curve, so a
	// failing run still shows how the heap grew.
	var violation string
	check := func(at int) {
		if violation != "" {
			return
		}
		for _, w := range e.Workers() {
			a := w.Accuracy
			if a.ModelBlocks > idx.Len() {
				violation = fmt.Sprintf("after %d requests: model of %s holds %d blocks, the index %d", at, w.URL, a.ModelBlocks, idx.Len())
			}
			if a.ModelCapacity > ceiling {
				violation = fmt.Sprintf("after %d requests: modelled capacity of %s is %d blocks, above the index's ceiling %d", at, w.URL, a.ModelCapacity, ceiling)
			}
		}
	}
	var now int64
	hashes := make([]uint64, 0, turns*blocksTurn)
	samples := map[int]uint64{}
	var misses uint64
	for k := 1; k <= requests; k++ {
		now += step
		conv, turn := k/turns, k%turns
		hashes = hashes[:0]
		for j := range (turn + 1) * blocksTurn {
			hashes = append(hashes, soakHash(conv, j))
		}
		keyLen := len(hashes) * testBC
		d, err := e.Choose(Request{Hashes: hashes, KeyLen: keyLen}, now)
		if err != nil {
			t.Fatal(err)
		}
		e.Release(d.Worker)
		prompt := keyLen / 4
		cached := d.ChosenChars / 4
		if k%5000 == 4999 {
			cached = 0 // the worker had evicted what the index predicted
		}
		e.Feedback(d.Worker, keyLen, d.ChosenChars, d.PlacedAgo, prompt, cached)
		if k%evictEvery == 0 {
			for !e.MaintainStep(now, maxEntries, 2048) {
			}
			check(k)
		}
		if k%(requests/4) == 0 {
			check(k)
			samples[k] = heapInUse()
		}
	}
	for _, w := range e.Workers() {
		misses += w.Accuracy.Misses
	}
	if misses == 0 {
		t.Fatal("no report was judged a miss: the closed loop was not exercised")
	}
	q := requests / 4
	t.Logf("heap after GC (HeapAlloc) at %d/%d/%d/%d requests: %.1f / %.1f / %.1f / %.1f MiB; index %d entries (max_tree_size %d)",
		q, 2*q, 3*q, 4*q, mib(samples[q]), mib(samples[2*q]), mib(samples[3*q]), mib(samples[4*q]), idx.Len(), maxEntries)
	for _, w := range e.Workers() {
		t.Logf("  %s: model %d blocks, capacity %d, misses %d", w.URL, w.Accuracy.ModelBlocks, w.Accuracy.ModelCapacity, w.Accuracy.Misses)
	}
	if violation != "" {
		t.Fatal(violation)
	}
	// Flat: the last quarter may not add more than a small slack over the
	// first (GC timing and map growth steps, not a leak).
	if last, first := samples[4*q], samples[q]; float64(last) > 1.25*float64(first)+2<<20 {
		t.Fatalf("heap grew from %.1f MiB at %d requests to %.1f MiB at %d", mib(first), q, mib(last), 4*q)
	}
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }
