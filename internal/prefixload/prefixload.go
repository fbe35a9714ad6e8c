// Package prefixload is the repeated-prefix workload that the failover
// benchmark and the data plane's shadow-index tests both drive: groups (a
// system prompt or a conversation) that requests share, each request with
// its own tail. Each worker's prefix cache is modelled as an LRU of a few
// groups, so the pool can hold every group once but not everywhere: routing
// blind thrashes it, as on real replicas. It lives apart from bench so that
// a test inside the data plane can use it without importing the benchmark.
package prefixload

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
)

// Workload is safe for concurrent use by the clients that drive it.
type Workload struct {
	mu          sync.Mutex
	rng         *rand.Rand
	groups      []string
	cacheGroups int
	caches      map[string][]int // worker -> groups cached, most recent last
	seen        map[int]bool
}

// New returns a workload of groups prefixes whose workers each cache
// cacheGroups of them; seed makes the request sequence reproducible.
func New(groups, cacheGroups int, seed uint64) *Workload {
	w := &Workload{rng: rand.New(rand.NewPCG(seed, 8)), cacheGroups: cacheGroups, caches: map[string][]int{}, seen: map[int]bool{}}
	for g := range groups {
		w.groups = append(w.groups, fmt.Sprintf("group-%04d: system prompt shared by every request of this group, about eight blocks", g))
	}
	return w
}

// Next returns a random group and a request key that starts with its
// prefix. The request's own part is random from its first character, so
// that two requests share exactly the group's prefix: with a few random
// characters only at the end of the block that straddles the prefix's
// end ("|question 123"), requests would share that block by chance, and a
// router would be credited or blamed for a match the workload did not
// mean to be there.
func (w *Workload) Next() (int, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	g := w.rng.IntN(len(w.groups))
	return g, fmt.Sprintf("%s|%016x question", w.groups[g], w.rng.Uint64())
}

// Prefix is group g's shared prefix.
func (w *Workload) Prefix(g int) string { return w.groups[g] }

// Landed sends group g's request to worker and reports whether the group
// was seen before (a repeat) and whether the worker still had it (a hit).
func (w *Workload) Landed(g int, worker string) (repeat, hit bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	repeat = w.seen[g]
	w.seen[g] = true
	c := w.caches[worker]
	if i := slices.Index(c, g); i >= 0 {
		hit = true
		c = slices.Delete(c, i, i+1)
	} else if len(c) >= w.cacheGroups {
		c = c[1:]
	}
	w.caches[worker] = append(c, g)
	return repeat, hit
}
