package router

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
)

// Local is the in-process Router: an engine behind a mutex, with the clock
// and the index maintenance (eviction, expiry, daily reset) that the pure
// packages leave to their caller.
type Local struct {
	mu  sync.Mutex
	eng *engine.Engine

	now         func() time.Time
	maxEntries  int
	lastCleanup time.Time
	cleanupHour int // -1 disables
}

// LocalOptions configure a Local router.
type LocalOptions struct {
	Policy      engine.Policy
	MaxEntries  int
	InlineEvict bool // no periodic eviction pass runs
	CleanupHour int  // UTC hour of the daily full reset, -1 disables
	Seed        uint64
	Now         func() time.Time // nil: time.Now
}

// NewLocal builds an in-process router over workers.
func NewLocal(o LocalOptions, workers []engine.WorkerSpec) *Local {
	if o.Now == nil {
		o.Now = time.Now
	}
	idx := index.New(index.Options{
		MaxEntries:  o.MaxEntries,
		Headroom:    o.MaxEntries / 8,
		InlineEvict: o.InlineEvict,
	})
	eng := engine.New(o.Policy, idx, rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15)))
	eng.SetWorkers(workers)
	return &Local{eng: eng, now: o.Now, maxEntries: o.MaxEntries, cleanupHour: o.CleanupHour, lastCleanup: o.Now()}
}

type localTicket struct {
	d      engine.Decision
	keyLen int
}

// Route implements Router.
func (l *Local) Route(_ context.Context, req *Request) (Decision, error) {
	start := time.Now()
	l.mu.Lock()
	d, err := l.eng.Route(engine.Request{
		Hashes:  req.Hashes,
		KeyLen:  req.KeyLen,
		Exclude: req.Exclude,
		DryRun:  req.DryRun,
		Session: req.Session,
	}, l.now().UnixNano())
	l.mu.Unlock()
	if err != nil {
		return Decision{}, unavailable(err)
	}
	// Placed points into the caller's hash buffer, which may be pooled
	// and reused once the request is over; the ticket outlives nothing
	// today, but must not depend on that.
	d.Placed = slices.Clone(d.Placed)
	return Decision{
		Worker:       d.Worker,
		Reason:       string(d.Reason),
		MatchedChars: d.MatchedChars,
		MatchedRatio: d.MatchedRatio,
		Candidate:    d.Candidate,
		ChosenChars:  d.ChosenChars,
		Latency:      time.Since(start),
		FromLeader:   true,
		Ticket:       &localTicket{d: d, keyLen: req.KeyLen},
	}, nil
}

// Done implements Router.
func (l *Local) Done(d Decision, o Outcome) {
	t, ok := d.Ticket.(*localTicket)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.eng.Release(t.d.Worker)
	if !o.Delivered {
		l.eng.Unplace(t.d)
		return
	}
	if o.PromptTokens > 0 && o.CachedTokens >= 0 {
		l.eng.Feedback(t.d.Worker, t.keyLen, t.d.ChosenChars, t.d.PlacedAgo, o.PromptTokens, o.CachedTokens)
	}
}

// Workers implements Router.
func (l *Local) Workers() []WorkerStatus {
	l.mu.Lock()
	ws := l.eng.Workers()
	kv := make([]engine.KVState, len(ws))
	for i, w := range ws {
		kv[i] = l.eng.KV(w.URL)
	}
	l.mu.Unlock()
	out := make([]WorkerStatus, len(ws))
	for i, w := range ws {
		out[i] = WorkerStatus{URL: w.URL, MaxLoad: w.MaxLoad, LoadPenalty: w.LoadPenalty, Healthy: w.Healthy, Load: w.Load, Source: w.Source, Draining: w.Draining,
			PredictedCachedTokens: w.Accuracy.PredictedTokens, ActualCachedTokens: w.Accuracy.ActualTokens,
			CacheMisses: w.Accuracy.Misses, ModelCapacityBlocks: w.Accuracy.ModelCapacity}
		if kv[i].On {
			out[i].KVEvents = &kv[i]
		}
	}
	return out
}

// SetHealthy records a health-check verdict.
func (l *Local) SetHealthy(url string, healthy bool) {
	l.mu.Lock()
	l.eng.SetHealthy(url, healthy)
	l.mu.Unlock()
}

// SetWorkers replaces the worker set, keeping kept workers' cache entries.
func (l *Local) SetWorkers(specs []engine.WorkerSpec) (removed []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.eng.SetWorkers(specs)
}

// SetDraining takes a worker out of new decisions (or puts it back).
func (l *Local) SetDraining(url string, draining bool) {
	l.mu.Lock()
	l.eng.SetDraining(url, draining)
	l.mu.Unlock()
}

// Load is a worker's in-flight count.
func (l *Local) Load(url string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.eng.Load(url)
}

// IndexStats reports the index counters plus the engine's underflow guard.
func (l *Local) IndexStats() (index.Stats, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.eng.Index().Stats(), l.eng.Underflows
}

// evictChunk bounds how long one eviction step holds the lock, so routing
// never waits long behind a pass over a large index.
const evictChunk = 2048

// EvictPass trims the index to its size bound in short locked steps, then
// applies the daily reset if its hour has come. It returns entries removed.
func (l *Local) EvictPass() int {
	l.mu.Lock()
	before := l.eng.Index().Stats().Evicted
	l.mu.Unlock()
	now := l.now().UnixNano()
	for done := false; !done; {
		l.mu.Lock()
		done = l.eng.MaintainStep(now, l.maxEntries, evictChunk)
		l.mu.Unlock()
	}
	l.maybeDailyReset()
	l.mu.Lock()
	defer l.mu.Unlock()
	return int(l.eng.Index().Stats().Evicted - before)
}

func (l *Local) maybeDailyReset() {
	if l.cleanupHour < 0 {
		return
	}
	now := l.now().UTC()
	due := time.Date(now.Year(), now.Month(), now.Day(), l.cleanupHour, 0, 0, 0, time.UTC)
	if now.Before(due) {
		due = due.AddDate(0, 0, -1)
	}
	if !l.lastCleanup.Before(due) {
		return
	}
	l.mu.Lock()
	l.eng.Index().Clear()
	l.lastCleanup = now
	l.mu.Unlock()
}

// Run drives periodic maintenance until ctx ends: an eviction pass every
// interval (the daily reset is checked on the same tick, or every minute
// when interval is 0).
func (l *Local) Run(ctx context.Context, interval time.Duration) {
	tick := interval
	if tick <= 0 {
		tick = time.Minute
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if interval > 0 {
				l.EvictPass()
			} else {
				l.maybeDailyReset()
			}
		}
	}
}
