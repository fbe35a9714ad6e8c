package daemon

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/kvtruth"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/every"
)

// kvFlushEvery is how often the leader proposes the index corrections its
// engines' KV events asked for: one ClearHoldings and one withdrawals-only PlaceBatch per
// window at most, however many events arrived.
const kvFlushEvery = 10 * time.Millisecond

// kvApplier is the leader's side of kvtruth. A worker's modelled capacity
// is leader soft state (like the closed loop's), set at once; every index
// change (a worker's holdings cleared, holdings its engine evicted) is a
// Raft command, batched, so that every node's index changes the same way
// and only by the log.
type kvApplier struct {
	dec   *decider.Decider
	apply func(ctx context.Context, cmd *cartv1.RaftCommand) error
	log   *slog.Logger

	pmu    sync.Mutex
	clears map[string]bool
	trims  map[string]map[uint64]bool
	kick   chan struct{}
	// seeder fills, on run's seeding loop, the models of workers nobody
	// modelled, from the index.
	seeder *decider.Seeder
}

func newKVApplier(dec *decider.Decider, apply func(context.Context, *cartv1.RaftCommand) error, log *slog.Logger) *kvApplier {
	a := &kvApplier{dec: dec, apply: apply, log: log, clears: map[string]bool{}, trims: map[string]map[uint64]bool{}, kick: make(chan struct{}, 1)}
	a.seeder = dec.NewSeeder(a.addTrim)
	return a
}

func (a *kvApplier) ClearHoldings(worker string) {
	a.pmu.Lock()
	a.clears[worker] = true
	delete(a.trims, worker) // the clear drops them anyway
	a.pmu.Unlock()
	// A clear is flushed at once: the worker must stop counting as a
	// holder within a commit, not a batch window.
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

func (a *kvApplier) ApplyKVReport(worker string, r engine.KVReport) {
	var trim []uint64
	var seed bool
	a.dec.Do(decider.OpKV, func(eng *engine.Engine) {
		trim = eng.ApplyKVReport(worker, r, nil)
		seed = eng.Seeding()
	})
	a.addTrim(worker, trim)
	if seed {
		// A worker nobody modelled (every event-fed one on a new leader):
		// its model fills from the index in short lock holds, on run's
		// seeding loop, not on this stream's goroutine.
		a.seeder.Wake()
	}
}

// addTrim queues holdings an engine evicted for the next withdrawal.
func (a *kvApplier) addTrim(worker string, trim []uint64) {
	if len(trim) == 0 {
		return
	}
	a.pmu.Lock()
	set := a.trims[worker]
	if set == nil {
		set = map[uint64]bool{}
		a.trims[worker] = set
	}
	for _, h := range trim {
		set[h] = true
	}
	a.pmu.Unlock()
}

// run proposes pending corrections until ctx ends; what is pending then is
// dropped (the next leader's consumer starts from its engines' streams).
func (a *kvApplier) run(ctx context.Context) {
	seeding := make(chan struct{})
	go func() {
		defer close(seeding)
		a.seeder.Run(ctx) // a seed ends between two steps when leadership does
	}()
	every.Tick(ctx, kvFlushEvery, a.kick, func() { a.flush(ctx) })
	<-seeding
}

// flush proposes the pending clears, then the pending trims. A proposal
// that fails is logged and not retried: the stream's next report asks
// for the same trim again, and a lost clear leaves only holdings the
// approximate index would have kept too.
func (a *kvApplier) flush(ctx context.Context) {
	a.pmu.Lock()
	clears := make([]string, 0, len(a.clears))
	for w := range a.clears {
		clears = append(clears, w)
	}
	var unplace []*cartv1.Placement
	for w, set := range a.trims {
		hs := make([]uint64, 0, len(set))
		for h := range set {
			hs = append(hs, h)
		}
		slices.Sort(hs)
		unplace = append(unplace, &cartv1.Placement{Worker: w, BlockHashes: hs})
	}
	clear(a.clears)
	clear(a.trims)
	a.pmu.Unlock()
	if len(clears) > 0 {
		slices.Sort(clears)
		a.propose(ctx, &cartv1.RaftCommand{Ignorable: true, Actor: "kv events (engines reported their caches cleared)",
			Body: &cartv1.RaftCommand_ClearHoldings{ClearHoldings: &cartv1.ClearHoldingsCommand{Workers: clears}}})
	}
	if len(unplace) > 0 {
		slices.SortFunc(unplace, func(x, y *cartv1.Placement) int { return strings.Compare(x.GetWorker(), y.GetWorker()) })
		// As the withdrawals of a PlaceBatch (no request id: no batcher owns
		// it), the entry every version applies; UnplaceBatch is legacy.
		a.propose(ctx, &cartv1.RaftCommand{Actor: "kv events (engines evicted)",
			Body: &cartv1.RaftCommand_PlaceBatch{PlaceBatch: &cartv1.PlaceBatchCommand{Withdrawals: unplace}}})
	}
}

func (a *kvApplier) propose(ctx context.Context, cmd *cartv1.RaftCommand) {
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := a.apply(actx, cmd); err != nil && ctx.Err() == nil {
		a.log.Warn("kv events: proposing an index correction", "err", err)
	}
}

// kvLeaderLoop consumes the engines' KV events while this node leads.
func (d *Daemon) kvLeaderLoop(m *kvtruth.Metrics) func(ctx context.Context) {
	return func(ctx context.Context) {
		app := newKVApplier(d.Dec, func(ctx context.Context, cmd *cartv1.RaftCommand) error {
			_, err := d.Node.Apply(ctx, cmd)
			return err
		}, d.log)
		done := make(chan struct{})
		go func() { defer close(done); app.run(ctx) }()
		defer func() { <-done }()
		r, err := kvtruth.Start(kvtruth.OptionsFrom(d.cfg, app, m, d.log))
		if err != nil {
			d.log.Error("kv events: not consumed", "err", err)
			<-ctx.Done()
			return
		}
		<-ctx.Done()
		r.Close()
	}
}
