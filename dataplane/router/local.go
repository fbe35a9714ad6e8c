package router

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
	"github.com/prometheus/client_golang/prometheus"
)

// Local is the in-process Router: the all-in-one mode's control plane in
// process, a decider.Decider answering the proxy directly.
type Local struct {
	dec *decider.Decider
	// seeder fills, on Run's seeding loop, the models of workers nobody
	// modelled, from the index (as the control-plane leader does).
	seeder *decider.Seeder
	// seedTrimHook, set by tests only, runs before each trim a seed
	// deferred, on the seeding loop.
	seedTrimHook func()
}

// LocalOptions configure a Local router.
type LocalOptions struct {
	Policy      engine.Policy
	MaxEntries  int
	InlineEvict bool // no periodic eviction pass runs
	CleanupHour int  // UTC hour of the daily full reset, -1 disables
	Seed        uint64
	Now         func() time.Time // nil: time.Now
	Flow        decider.FlowOptions
}

// NewLocal builds an in-process router over workers.
func NewLocal(o LocalOptions, workers []engine.WorkerSpec) *Local {
	dec := decider.New(decider.Options{
		Policy:      o.Policy,
		MaxEntries:  o.MaxEntries,
		InlineEvict: o.InlineEvict,
		// As on a control-plane node: a table grown under the lock stalls
		// the insert that allocates the next array (index.Options.Presize).
		PresizeIndex: true,
		DailyReset:   o.CleanupHour >= 0,
		ResetHourUTC: o.CleanupHour,
		Rand:         rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15)),
		Now:          o.Now,
		Flow:         o.Flow,
	})
	dec.SetWorkers(workers)
	l := &Local{dec: dec}
	l.seeder = dec.NewSeeder(l.seedTrim)
	return l
}

// Decide implements Router: a decision at once while a worker has room,
// else a wait in the flow-control queue until one does (or ctx ends, or
// flow control refuses the request).
func (l *Local) Decide(ctx context.Context, req *Request) (Decision, error) {
	start := time.Now()
	d, err := l.dec.Admit(ctx, decider.Request{Request: engine.Request{
		Hashes:  req.Hashes,
		KeyLen:  req.KeyLen,
		Exclude: req.Exclude,
		Avoid:   req.Avoid,
		DryRun:  req.DryRun,
		Session: req.Session,
		Disagg:  req.Disagg,
	}}, req.Admission)
	if err != nil {
		return Decision{}, err
	}
	out := Decision{
		Worker:       d.Worker,
		Reason:       string(d.Reason),
		MatchedChars: d.MatchedChars,
		MatchedRatio: d.MatchedRatio,
		Candidate:    d.Candidate,
		ChosenChars:  d.ChosenChars,
		Latency:      time.Since(start),
		FromLeader:   true,
		Ticket:       d.Ticket,
		AvoidIgnored: d.AvoidIgnored,
		Waited:       d.Waited,
		Source:       d.WorkerSource,
		Whole:        d.Whole,
	}
	if p := d.Prefill; p != nil {
		out.Prefill = &Decision{Worker: p.Worker, Reason: string(p.Reason), MatchedChars: p.MatchedChars, MatchedRatio: p.MatchedRatio,
			Candidate: p.Candidate, ChosenChars: p.ChosenChars, Latency: out.Latency, FromLeader: true, Ticket: d.PrefillTicket, Source: p.WorkerSource}
	}
	return out, nil
}

// Done implements Router. A ticket this router did not issue is refused
// and counted (cart_decider_rejected_tickets_total), never silently
// ignored.
func (l *Local) Done(d Decision, o Outcome) {
	_ = l.dec.Settle(d.Ticket, o)
}

// Workers implements Router.
func (l *Local) Workers() []WorkerStatus {
	ws := l.dec.Workers()
	kv := l.dec.KVStates()
	conc := l.dec.Concurrencies()
	out := make([]WorkerStatus, len(ws))
	for i, w := range ws {
		out[i] = WorkerStatus{URL: w.URL, MaxLoad: w.MaxLoad, Concurrency: conc[w.URL], LoadPenalty: w.LoadPenalty, Healthy: w.Healthy, Load: w.Load, Source: w.Source, Draining: w.Draining, Role: w.Role,
			PredictedCachedTokens: w.Accuracy.PredictedTokens, ActualCachedTokens: w.Accuracy.ActualTokens,
			CacheMisses: w.Accuracy.Misses, ModelCapacityBlocks: w.Accuracy.ModelCapacity}
		if k := kv[w.URL]; k.On {
			out[i].KVEvents = &k
		}
	}
	return out
}

// SetHealthy records a health-check verdict.
func (l *Local) SetHealthy(url string, healthy bool) { l.dec.SetHealthy(url, healthy) }

// SetWorkers replaces the worker set, keeping kept workers' cache entries.
func (l *Local) SetWorkers(specs []engine.WorkerSpec) (removed []string) {
	return l.dec.SetWorkers(specs)
}

// SetDraining takes a worker out of new decisions (or puts it back).
func (l *Local) SetDraining(url string, draining bool) { l.dec.SetDraining(url, draining) }

// Load is a worker's in-flight count.
func (l *Local) Load(url string) int { return l.dec.Load(url) }

// WorkerSource is the source of the worker at url, and whether it is in
// the set.
func (l *Local) WorkerSource(url string) (string, bool) { return l.dec.WorkerSource(url) }

// IndexStats reports the index counters plus the engine's underflow guard.
func (l *Local) IndexStats() (index.Stats, uint64) { return l.dec.IndexStats() }

// EvictPass runs one maintenance pass (eviction, expiry, the daily reset)
// and returns the entries evicted.
func (l *Local) EvictPass() int { return l.dec.Maintain() }

// Run drives periodic maintenance (see decider.Run) and the seeding of
// workers' models (ApplyKVReport) until ctx ends, and returns once both
// stopped.
func (l *Local) Run(ctx context.Context, interval time.Duration) {
	seeding := make(chan struct{})
	go func() {
		defer close(seeding)
		l.seeder.Run(ctx)
	}()
	l.dec.Run(ctx, interval)
	<-seeding
}

// Collectors are the routing core's metrics (lock hold, rejected
// tickets), for the data plane's /metrics.
func (l *Local) Collectors() []prometheus.Collector { return l.dec.Collectors() }

// ObserveEngine hands a worker's engine metrics to the learned concurrency.
func (l *Local) ObserveEngine(url string, e engine.EngineLoad) (before, after int) {
	return l.dec.ObserveEngine(url, e)
}

// Queue lists the requests waiting for a worker.
func (l *Local) Queue() decider.QueueStatus { return l.dec.Queue() }

// PoolSaturation is the pool's demand against its known slots.
func (l *Local) PoolSaturation() decider.PoolLoad { return l.dec.PoolSaturation() }
