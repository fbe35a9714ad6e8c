package engine

import (
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/cartrouter/cart/controlplane/index"
)

// Errors returned when no worker can take the request. Callers map all of
// them to 503 with a message that tells the operator which case it is.
var (
	ErrNoWorkers    = errors.New("no workers configured")
	ErrNoHealthy    = errors.New("no healthy workers")
	ErrAllExcluded  = errors.New("every healthy worker is excluded for this request (circuit open or already failed)")
	ErrAllSaturated = errors.New("every usable worker is saturated (at max_load or its concurrency)")
)

// Policy holds the routing thresholds (cache.* in the config).
type Policy struct {
	// Threshold: route by cache when matched/total characters >= this.
	Threshold float64
	// MatchAbsThreshold: or when at least this many characters match
	// (0 disables the absolute rule).
	MatchAbsThreshold int
	// BalanceAbsThreshold and BalanceRelThreshold: a cache candidate C is
	// dropped for the least-loaded L when load(C)-load(L) > abs AND
	// load(C) > load(L)*rel.
	BalanceAbsThreshold int
	BalanceRelThreshold float64
	// BlockChars is the index block size, to turn blocks into characters.
	BlockChars int

	// Routing-quality mechanisms (each off at its zero value): capacity.go,
	// closedloop.go, sessions.go, hot.go.

	// CapacityBlocks is the default modelled prefix-cache capacity of a
	// worker in index blocks (0 = unbounded): the index forgets what a
	// replica of that size has most likely evicted.
	CapacityBlocks int
	// TTL ignores placements older than this many nanoseconds.
	TTL int64
	// ClosedLoop adapts each worker's modelled capacity to the cached
	// tokens the worker reports (Feedback).
	ClosedLoop bool
	// SessionTTL enables session affinity: a request with a session key
	// sticks to its session's worker (under the balance rule) until the
	// session has been idle this many nanoseconds.
	SessionTTL int64
	// HotFraction enables hot-prefix spreading: a prefix seen in at least
	// this fraction of recent requests does not count as a match.
	HotFraction float64
	// MaxSessions bounds the session table, least recently used first
	// out (0 = unbounded).
	MaxSessions int
	// ReservePriority and ReserveSlots are the headroom for high-priority
	// traffic (saturation.go): while it is active, requests of a lower
	// priority see every worker's limit lowered by ReserveSlots.
	ReservePriority int
	ReserveSlots    int
	// PDThresholdTokens: a request that may be disaggregated goes whole
	// to one worker when fewer of its prompt tokens than this are not
	// already cached there (roles.go); 0 disaggregates every one.
	PDThresholdTokens int
}

// WorkerSpec is what the engine needs to know about a worker.
type WorkerSpec struct {
	URL         string
	MaxLoad     int // 0 = no cap
	LoadPenalty int
	// CapacityBlocks overrides Policy.CapacityBlocks (0 = use it).
	CapacityBlocks int
	// Source says where the worker came from ("static", "admin", "dns");
	// discovery only ever removes workers of its own source.
	Source string
	// MaxConcurrency is how many requests the worker's engine runs at once
	// (its max_num_seqs); 0 = learn it from the engine's metrics
	// (saturation.go).
	MaxConcurrency int
	// Role says which part of a request the worker serves (roles.go):
	// RoleBoth (the zero value) whole requests, RolePrefill and
	// RoleDecode one leg of a disaggregated one.
	Role Role
}

type worker struct {
	id      index.WorkerID
	spec    WorkerSpec
	healthy bool
	// draining keeps the worker out of new decisions while its in-flight
	// requests finish (it left its discovery source).
	draining bool
	load     int // in-flight requests placed and not yet released
	learned  int // concurrency learned from the engine (0 = unknown)
	atLimit  int // observations in a row at the learned limit, nothing waiting
	// probing: the limit was last raised by a probe (ObserveEngine) whose
	// outcome is not known yet; growAfter is the observations in a row at
	// the limit the next probe waits for (0: GrowAfter).
	probing   bool
	growAfter int
	model     *blockLRU
	acc       Accuracy
	kv        kvFeed     // the engine's own KV-cache events (kvtruth.go)
	seed      *modelSeed // the model's seed in progress, if any (seed.go)
}

// Request is one routing question.
type Request struct {
	// Hashes are the chained block hashes of the key text (index.Hash).
	Hashes []uint64
	// KeyLen is the key text length in characters (bytes).
	KeyLen int
	// Exclude lists worker URLs this request must not go to: replicas that
	// already failed it, or whose circuit breaker is open at the caller.
	Exclude []string
	// Avoid lists worker URLs to keep out unless that leaves no usable
	// worker (a caller's open circuit breakers): then they are ignored and
	// Decision.AvoidIgnored says so. Refusing every client would be worse
	// than a trial request to a replica that may have recovered, and
	// deciding it here costs the caller one decision instead of two.
	Avoid []string
	// DryRun decides without taking load or recording a placement.
	DryRun bool
	// Session is the request's session key ("" = none).
	Session string
	// Priority is the request's flow-control priority: below
	// Policy.ReservePriority it cannot use the slots kept in reserve.
	Priority int
	// NoProbe keeps the request out of a slot its engine has not shown it
	// has: the top slot of a learned limit just raised by a probe
	// (ObserveEngine), which the engine may answer by queueing the request
	// behind a whole running sequence. Flow control gives such a slot to
	// the waiting request its policy would serve last.
	NoProbe bool
	// Disagg says whether the request may be split between a prefill and
	// a decode worker (roles.go); the zero value routes it whole.
	Disagg Disagg
	// AnyRole lets the request go to a worker of any role: a request
	// pinned to the one worker holding its stored response.
	AnyRole bool
}

// Decision is the engine's answer.
type Decision struct {
	Worker       string
	Reason       Reason
	MatchedChars int
	MatchedRatio float64
	// Placed are the hashes newly recorded for Worker by this decision:
	// Unplace removes exactly these if the request never reached it.
	Placed []uint64
	// Touched are the hashes Worker already held and this decision
	// matched again (the path up to its deepest held block): their LRU
	// recency was refreshed, which a leader replicates so that followers
	// age them alike. Like Placed, it points into Request.Hashes.
	Touched []uint64
	// Candidate is the cache candidate's URL, if there was one.
	Candidate string
	// ChosenChars is how many key characters the chosen worker holds
	// according to the index: the predicted cached prefix.
	ChosenChars int
	// HotChars is the leading part of the key that counted as a hot
	// (widely shared) prefix and was not treated as a match.
	HotChars int
	// PlacedAgo is how long ago (nanoseconds) the chosen worker was sent
	// the predicted prefix; -1 when nothing was predicted.
	PlacedAgo int64
	// AvoidIgnored: every usable worker was in Request.Avoid, so the
	// decision ignored the list (the request is a trial).
	AvoidIgnored bool
	// WorkerSource is Worker's WorkerSpec.Source: whoever sends the request
	// decides by it whether the pool's worker key goes along.
	WorkerSource string
	// Prefill is the prefill leg of a disaggregated decision (Reason
	// ReasonPD): its worker computes the prompt, holds its placement and
	// took a unit of load of its own; Worker decodes. nil otherwise.
	Prefill *Decision
	// Whole says why a request that could have been disaggregated went
	// whole to one worker (WholeShortPrompt...); "" when it was split, or
	// could not be (not a split pool, or not asked).
	Whole string
}

// MaxRouteBlocks bounds the blocks one decision matches and records: 128k
// characters (about 32k tokens) at the default 128-character blocks. Route
// ignores the blocks past it: prefix matching needs only the prefix, and
// a decision runs under the caller's routing lock, so its cost must not
// grow with the prompt. Measured on a 1M-entry index (BenchmarkRouteMaxBlocks,
// CPU time on a busy 2-core VM): 1024 blocks cost about 40 us as a hit and
// 0.5 ms as a miss with inline eviction; 4096 blocks cost 0.5 ms and 2.2 ms.
// The price is that prompts sharing their first 1024 blocks are not told
// apart by what follows. Callers that hash prompts stop there too.
const MaxRouteBlocks = 1024

// Engine is the routing state. Not safe for concurrent use.
type Engine struct {
	pol      Policy
	idx      *index.Index
	rng      *rand.Rand
	workers  []*worker // in configuration order
	byURL    map[string]*worker
	byID     map[index.WorkerID]*worker
	nextID   index.WorkerID
	match    index.Match // scratch, reused: the route path must not allocate
	usable   []*worker   // scratch
	sessions sessionTable
	hot      hotTracker
	evicted  []uint64 // scratch for the capacity model
	seeds    seeder   // models being seeded from the index (seed.go)
	// reserveActive and freed: saturation.go.
	reserveActive bool
	freed         uint64
	// Underflows counts releases of a worker with no load: a caller bug
	// that the guard absorbed. Exported as a metric so it cannot hide.
	Underflows uint64
}

// New returns an engine over idx with the given policy. rng breaks ties.
func New(pol Policy, idx *index.Index, rng *rand.Rand) *Engine {
	if pol.BlockChars <= 0 {
		panic("engine: Policy.BlockChars must be positive")
	}
	e := &Engine{
		pol:   pol,
		idx:   idx,
		rng:   rng,
		byURL: make(map[string]*worker),
		byID:  make(map[index.WorkerID]*worker),
	}
	idx.OnRelease(e.released)
	return e
}

// Index exposes the prefix index (for eviction passes and stats).
func (e *Engine) Index() *index.Index { return e.idx }

// Policy returns the thresholds in force.
func (e *Engine) Policy() Policy { return e.pol }

// SetWorkers replaces the worker set. Workers that stay keep their load,
// health and index entries (the cache stays warm across a reload); removed
// workers' index entries are dropped. New workers start healthy: the health
// checker demotes them if they are not. It returns the removed URLs.
func (e *Engine) SetWorkers(specs []WorkerSpec) (removed []string) {
	keep := make(map[string]bool, len(specs))
	next := make([]*worker, 0, len(specs))
	for _, s := range specs {
		keep[s.URL] = true
		if w, ok := e.byURL[s.URL]; ok {
			w.spec = s
			e.resizeModel(w)
			next = append(next, w)
			continue
		}
		w := &worker{id: e.nextID, spec: s, healthy: true}
		e.resizeModel(w)
		e.nextID++
		e.byURL[s.URL] = w
		e.byID[w.id] = w
		next = append(next, w)
	}
	for _, w := range e.workers {
		if keep[w.spec.URL] {
			continue
		}
		removed = append(removed, w.spec.URL)
		delete(e.byURL, w.spec.URL)
		delete(e.byID, w.id)
		e.idx.RetireWorker(w.id) // ids are never reused; MaintainStep purges
	}
	e.workers = next
	e.freed++ // new workers, or raised limits
	return removed
}

// SetHealthy marks a worker healthy or not. Unknown URLs are ignored (the
// worker may have been removed while its probe was in flight).
func (e *Engine) SetHealthy(url string, healthy bool) {
	if w, ok := e.byURL[url]; ok {
		if healthy && !w.healthy {
			e.freed++
		}
		w.healthy = healthy
	}
}

// SetDraining takes a worker out of new decisions (or puts it back) without
// removing it, so requests in flight to it finish and release their load.
// Unknown URLs are ignored.
func (e *Engine) SetDraining(url string, draining bool) {
	if w, ok := e.byURL[url]; ok {
		if !draining && w.draining {
			e.freed++
		}
		w.draining = draining
	}
}

// WorkerState is a read-only view of one worker.
type WorkerState struct {
	WorkerSpec
	Healthy  bool
	Draining bool
	Load     int
	// Accuracy compares the index's predictions with reported usage.
	Accuracy Accuracy
}

// Workers returns the workers in configuration order.
func (e *Engine) Workers() []WorkerState {
	out := make([]WorkerState, len(e.workers))
	for i, w := range e.workers {
		out[i] = WorkerState{WorkerSpec: w.spec, Healthy: w.healthy, Draining: w.draining, Load: w.load, Accuracy: w.accuracy()}
	}
	return out
}

// SourceOf returns the source of the worker at url, and whether it is in
// the set.
func (e *Engine) SourceOf(url string) (string, bool) {
	if w, ok := e.byURL[url]; ok {
		return w.spec.Source, true
	}
	return "", false
}

// Load returns a worker's in-flight count (0 for unknown workers).
func (e *Engine) Load(url string) int {
	if w, ok := e.byURL[url]; ok {
		return w.load
	}
	return 0
}

// Release gives back the load a non-dry-run Route took on url. Callers must
// release each decision exactly once; a release with no load outstanding is
// absorbed (load never goes negative) and counted in Underflows.
func (e *Engine) Release(url string) {
	w, ok := e.byURL[url]
	if !ok {
		return // removed while the request was in flight
	}
	if w.load <= 0 {
		e.Underflows++
		return
	}
	w.load--
	e.freed++
}

// Unplace withdraws the placement a decision recorded, for a request that
// never reached its worker (connection refused, retried elsewhere), so the
// index does not claim the worker holds a prefix it never saw.
func (e *Engine) Unplace(d Decision) {
	if w, ok := e.byURL[d.Worker]; ok && len(d.Placed) > 0 {
		e.idx.RemoveHolder(d.Placed, w.id)
		if w.model != nil {
			w.model.remove(d.Placed)
		}
	}
}

func (e *Engine) effLoad(w *worker) int { return w.load + w.spec.LoadPenalty }

// Choose decides where req goes at time now. Unless req.DryRun, it takes one
// unit of load on the chosen worker (give it back with Release) and records
// the prefix for it (withdraw with Unplace). A request that may be split
// between prefill and decode workers (req.Disagg, roles.go) takes one unit
// on each worker of the pair.
func (e *Engine) Choose(req Request, now int64) (Decision, error) {
	if len(req.Hashes) > MaxRouteBlocks {
		req.Hashes = req.Hashes[:MaxRouteBlocks]
	}
	switch req.Disagg {
	case DisaggPair:
		return e.routePair(req, now)
	case DisaggDecode:
		return e.routeDecode(req, now)
	}
	c, err := e.pickAmong(req, e.aggregatedRoles(req), now)
	if err != nil {
		return Decision{}, err
	}
	e.commit(&c, req, now, true)
	return c.d, nil
}

// choice is a decision made but not yet taken: choose has no effect on
// the engine's state beyond its scratch space, so a caller may weigh
// several choices (roles.go) before it commits one.
type choice struct {
	w      *worker
	d      Decision
	blocks int // leading blocks of the key the chosen worker holds
}

// pickAmong picks a worker among the usable ones of the given roles.
func (e *Engine) pickAmong(req Request, roles RoleMask, now int64) (choice, error) {
	avoidIgnored := false
	if err := e.collectUsable(req.Exclude, req.Avoid, req.Priority, req.NoProbe, roles); err != nil {
		if len(req.Avoid) == 0 {
			return choice{}, err
		}
		// The avoid list is soft, so the error, if any, is the one of
		// the request without it (saturated, not "all excluded").
		if err := e.collectUsable(req.Exclude, nil, req.Priority, req.NoProbe, roles); err != nil {
			return choice{}, err
		}
		avoidIgnored = true
	}
	least := e.leastLoaded()

	d := Decision{PlacedAgo: -1, AvoidIgnored: avoidIgnored}
	var chosen *worker
	var chosenBlocks int
	if req.KeyLen == 0 || len(req.Hashes) == 0 {
		chosen, d.Reason = least, ReasonEmptyText
	} else {
		hotBlocks := e.hot.depth(req.Hashes, e.pol.HotFraction)
		cand, blocks := e.cacheCandidate(req.Hashes, now)
		if cand != nil {
			d.MatchedChars = index.MatchedChars(blocks, req.KeyLen, e.pol.BlockChars)
			d.MatchedRatio = float64(d.MatchedChars) / float64(req.KeyLen)
		}
		// A hot prefix (held everywhere, e.g. a global system prompt)
		// says nothing about where the rest of the prompt lives: judge
		// the match on what follows it.
		effChars, effRatio := d.MatchedChars, d.MatchedRatio
		if hotBlocks > 0 && cand != nil {
			d.HotChars = index.MatchedChars(hotBlocks, req.KeyLen, e.pol.BlockChars)
			effChars = max(0, d.MatchedChars-d.HotChars)
			if rest := req.KeyLen - d.HotChars; rest > 0 {
				effRatio = float64(effChars) / float64(rest)
			} else {
				effRatio = 0
			}
		}
		sess := e.sessionWorker(req.Session, now)
		switch {
		case sess != nil && !e.overloaded(sess, least):
			chosen, d.Reason = sess, ReasonSessionHit
		case cand == nil || !e.goodMatch(effChars, effRatio):
			chosen, d.Reason = least, ReasonCacheMiss
		case e.overloaded(cand, least):
			d.Candidate = cand.spec.URL
			chosen, d.Reason = least, ReasonHitOverloaded
		default:
			d.Candidate = cand.spec.URL
			chosen, d.Reason = cand, ReasonCacheHit
		}
		chosenBlocks = e.match.BlocksFor(chosen.id)
		d.ChosenChars = index.MatchedChars(chosenBlocks, req.KeyLen, e.pol.BlockChars)
		if chosenBlocks > 0 {
			d.PlacedAgo = e.placedAgo(req.Hashes[chosenBlocks-1], chosen.id, now)
		}
	}
	d.Worker, d.WorkerSource = chosen.spec.URL, chosen.spec.Source
	return choice{w: chosen, d: d, blocks: chosenBlocks}, nil
}

// commit takes c (unless req.DryRun): one unit of load on its worker and,
// with place, the session and the prompt's placement there.
func (e *Engine) commit(c *choice, req Request, now int64, place bool) {
	if req.DryRun {
		return
	}
	chosen, d := c.w, &c.d
	chosen.load++
	if !place {
		return
	}
	if req.Session != "" && e.pol.SessionTTL > 0 {
		e.setSession(req.Session, chosen.id, now)
	}
	if d.Reason != ReasonEmptyText {
		e.hot.observe(req.Hashes, e.pol.HotFraction)
		skipped := e.idx.Insert(req.Hashes, chosen.id, now)
		e.modelTouch(chosen, req.Hashes, skipped > 0)
		// Blocks the worker already held stay its own if the request is
		// withdrawn; only the ones this decision added are undone.
		if c.blocks < len(req.Hashes) {
			d.Placed = req.Hashes[c.blocks:]
		}
		if c.blocks > 0 {
			d.Touched = req.Hashes[:c.blocks:c.blocks]
		}
	}
}

// collectUsable fills e.usable with the healthy, not draining, not
// saturated workers of the given roles in neither exclude nor avoid.
func (e *Engine) collectUsable(exclude, avoid []string, prio int, noProbe bool, roles RoleMask) error {
	e.usable = e.usable[:0]
	if len(e.workers) == 0 {
		return ErrNoWorkers
	}
	healthy, notExcluded := 0, 0
	for _, w := range e.workers {
		// A draining worker is on its way out: for new requests it counts
		// as gone.
		if !w.healthy || w.draining || !roles.Has(w.spec.Role) {
			continue
		}
		healthy++
		if contains(exclude, w.spec.URL) || contains(avoid, w.spec.URL) {
			continue
		}
		notExcluded++
		if e.saturated(w, prio, noProbe) {
			continue
		}
		e.usable = append(e.usable, w)
	}
	switch {
	case len(e.usable) > 0:
		return nil
	case healthy == 0:
		return ErrNoHealthy
	case notExcluded == 0:
		return ErrAllExcluded
	default:
		return ErrAllSaturated
	}
}

// leastLoaded picks the usable worker with the lowest effective load,
// breaking ties uniformly at random (reservoir sampling) so that several
// routers never stampede onto the same replica.
func (e *Engine) leastLoaded() *worker {
	var best *worker
	ties := 0
	for _, w := range e.usable {
		switch {
		case best == nil || e.effLoad(w) < e.effLoad(best):
			best, ties = w, 1
		case e.effLoad(w) == e.effLoad(best):
			if c := e.kvRoomCmp(w, best); c != 0 {
				if c > 0 {
					best, ties = w, 1
				}
				continue
			}
			ties++
			if e.rng.IntN(ties) == 0 {
				best = w
			}
		}
	}
	return best
}

// cacheCandidate returns the usable worker holding the longest prefix of
// hashes (ties: least loaded, then random) and its matched block count.
func (e *Engine) cacheCandidate(hashes []uint64, now int64) (*worker, int) {
	if e.pol.TTL > 0 {
		e.idx.LookupSince(hashes, now-e.pol.TTL, &e.match)
	} else {
		e.idx.Lookup(hashes, &e.match)
	}
	var best *worker
	bestBlocks, ties := 0, 0
	for i, id := range e.match.Workers {
		w, ok := e.byID[id]
		if !ok || !e.isUsable(w) {
			continue
		}
		b := e.match.Blocks[i]
		switch {
		case best == nil || b > bestBlocks || (b == bestBlocks && e.effLoad(w) < e.effLoad(best)):
			best, bestBlocks, ties = w, b, 1
		case b == bestBlocks && e.effLoad(w) == e.effLoad(best):
			ties++
			if e.rng.IntN(ties) == 0 {
				best = w
			}
		}
	}
	return best, bestBlocks
}

func (e *Engine) isUsable(w *worker) bool {
	for _, u := range e.usable {
		if u == w {
			return true
		}
	}
	return false
}

func (e *Engine) goodMatch(chars int, ratio float64) bool {
	if chars <= 0 {
		return false
	}
	if ratio >= e.pol.Threshold {
		return true
	}
	return e.pol.MatchAbsThreshold > 0 && chars >= e.pol.MatchAbsThreshold
}

func (e *Engine) overloaded(c, l *worker) bool {
	lc, ll := e.effLoad(c), e.effLoad(l)
	return lc-ll > e.pol.BalanceAbsThreshold && float64(lc) > float64(ll)*e.pol.BalanceRelThreshold
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// String renders a decision for logs and errors.
func (d Decision) String() string {
	return fmt.Sprintf("%s -> %s (matched %d chars, %.2f)", d.Reason, d.Worker, d.MatchedChars, d.MatchedRatio)
}

// ApplyPlacement records a replicated placement the way Route records its
// own: in the index and in the worker's capacity model. A follower that
// skipped the model would keep, once it leads, every holding the old
// leader's model had already dropped, and route to replicas that no longer
// hold the prefix (measured: a leader change cost a third of the hit ratio,
// bench/results/2026-12-01-failover).
func (e *Engine) ApplyPlacement(url string, hashes []uint64, at int64) {
	w, ok := e.byURL[url]
	if !ok {
		return
	}
	skipped := e.idx.Insert(hashes, w.id, at)
	e.modelTouch(w, hashes, skipped > 0)
}

// ApplyTouch refreshes, to at, the recency of the leading blocks of hashes
// that url still holds here, and adds no holding (a replicated touch: the
// leader may have withdrawn a placement the touch refreshed). It returns
// the blocks refreshed.
func (e *Engine) ApplyTouch(url string, hashes []uint64, at int64) []uint64 {
	w, ok := e.byURL[url]
	if !ok {
		return nil
	}
	hashes = hashes[:e.idx.TouchHeld(hashes, w.id, at)]
	if len(hashes) > 0 {
		e.modelTouch(w, hashes, false)
	}
	return hashes
}
