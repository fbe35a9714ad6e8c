package remote

import (
	"sync"
	"time"

	"github.com/cartrouter/cart/controlplane/index"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// DefaultShadowEntries bounds the shadow index when the caller does not:
// about 7.5 MB at the index's ~116 bytes per entry. Prompts are stored by
// their checkpoint hashes (8 for the first 8 blocks, then one per 8
// blocks), so at 128-character blocks it remembers roughly 8-60 M
// characters of recent prompts, short prompts at the low end.
const DefaultShadowEntries = 1 << 16

// ShadowOptions configure the fallback's shadow index. The thresholds are
// the control plane's routing rule (cache.threshold, match_abs_threshold,
// balance_*), applied to this data plane's own view.
type ShadowOptions struct {
	// Entries bounds the shadow (LRU); 0 disables it, and fallback routes
	// least-loaded only.
	Entries       int
	Threshold     float64
	MatchAbsChars int
	BalanceAbs    int
	BalanceRel    float64
}

// shadow is the data plane's bounded memory of recent decisions, prefix
// block hashes -> worker: the control plane's answers and its own
// fallbacks. When the control plane cannot answer in time (a slow leader,
// a cut link, an election), fallback routes a prompt whose prefix it has
// seen to the worker it sent that prefix to, instead of routing every
// request cache-blind. It is a hint, never authoritative: it knows only
// this data plane's traffic and forgets the oldest prefixes first.
type shadow struct {
	o  ShadowOptions
	mu sync.Mutex
	// idx is the control plane's own index type, evicting inline.
	idx   *index.Index
	ids   map[string]index.WorkerID
	urls  []string // by WorkerID
	match index.Match
	cp    []uint64 // scratch: checkpoints of a recorded prompt
}

// maxShadowWorkers bounds the worker-id registry: a data plane that has
// seen this many distinct worker URLs (churn over a long life) starts the
// shadow over rather than grow.
const maxShadowWorkers = 4096

func newShadow(o ShadowOptions) *shadow {
	if o.Entries <= 0 {
		return nil
	}
	s := &shadow{o: o, idx: index.New(index.Options{MaxEntries: o.Entries, InlineEvict: true, Presize: true})}
	s.ids = map[string]index.WorkerID{}
	return s
}

// reset starts the shadow over. s.mu held: the index empties its presized
// table in place rather than allocate another under the lock.
func (s *shadow) reset() {
	s.idx.Reset()
	s.ids = map[string]index.WorkerID{}
	s.urls = s.urls[:0]
}

// record remembers that worker was sent the prefix hashes, and forgets
// any other worker it had sent them to: the latest placement of a prefix
// is where it is most likely still cached. Keeping every past holder
// instead lets a hot prefix, spread over the pool by the balance rule and
// the control plane's capacity model, end up held by every worker, and
// pick then breaks the tie by load: cache-blind routing (measured in
// bench/results/2026-12-01-failover). Like the placement feed's, a prompt
// is stored by its checkpoint hashes only: were this data plane's records
// whole paths, a later fed placement of the same prompt would take the
// checkpoints from the earlier holder and leave it the blocks between
// them, enough to win a match that ends there.
func (s *shadow) record(hashes []uint64, worker string) {
	if s == nil || len(hashes) == 0 || worker == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cp = index.Checkpoints(s.cp[:0], hashes)
	s.replace(s.cp, worker, time.Now().UnixNano())
}

// recordFed remembers the leader's placements for every data plane (the
// placement feed), stored by their checkpoint hashes: pick finds them by
// the same positions of its own prompts (index.LookupCheckpoints).
func (s *shadow) recordFed(p []*cartv1.RecentPlacement) {
	if s == nil || len(p) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now().UnixNano()
	for _, pl := range p {
		if len(pl.GetHashes()) > 0 && pl.GetWorker() != "" {
			s.replace(pl.GetHashes(), pl.GetWorker(), now)
		}
	}
}

// replace makes worker the only holder of hashes. s.mu held.
func (s *shadow) replace(hashes []uint64, worker string, now int64) {
	id, ok := s.ids[worker]
	if !ok {
		if len(s.urls) >= maxShadowWorkers {
			s.reset()
		}
		id = index.WorkerID(len(s.urls))
		s.ids[worker] = id
		s.urls = append(s.urls, worker)
	}
	s.idx.Lookup(hashes, &s.match)
	for _, w := range s.match.Workers {
		if w != id {
			s.idx.RemoveHolder(hashes, w)
		}
	}
	s.idx.Insert(hashes, id, now)
}

// usableWorker is a fallback candidate with its effective local load.
type usableWorker struct {
	url string
	eff int
}

// pick returns the usable worker holding the longest recorded prefix of
// hashes (ties, rare since record keeps the latest holder of a block only:
// lower load, and the caller's least-loaded pick, which breaks ties at
// random, among equals) if the match is good enough and the
// worker is not overloaded against the least-loaded one, by the control
// plane's rule; "" otherwise. It also returns the matched characters.
func (s *shadow) pick(hashes []uint64, keyLen, blockChars int, usable []usableWorker, least string, leastEff int) (string, int) {
	if s == nil || len(hashes) == 0 || keyLen <= 0 || blockChars <= 0 {
		return "", 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.idx.LookupCheckpoints(hashes, &s.match)
	best, bestBlocks, bestEff := "", 0, 0
	for _, u := range usable {
		id, ok := s.ids[u.url]
		if !ok {
			continue
		}
		b := s.match.BlocksFor(id)
		if b > bestBlocks || (b == bestBlocks && b > 0 && u.eff < bestEff) {
			best, bestBlocks, bestEff = u.url, b, u.eff
		}
	}
	if best == "" {
		return "", 0
	}
	if id, ok := s.ids[least]; ok && s.match.BlocksFor(id) == bestBlocks && leastEff <= bestEff {
		best, bestEff = least, leastEff
	}
	chars := index.MatchedChars(bestBlocks, keyLen, blockChars)
	good := float64(chars)/float64(keyLen) >= s.o.Threshold || (s.o.MatchAbsChars > 0 && chars >= s.o.MatchAbsChars)
	overloaded := bestEff-leastEff > s.o.BalanceAbs && float64(bestEff) > float64(leastEff)*s.o.BalanceRel
	if !good || overloaded {
		return "", chars
	}
	return best, chars
}
