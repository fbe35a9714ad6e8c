package daemon

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
	"github.com/cartrouter/cart/controlplane/state"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
)

// The leader's KV-event corrections reach the index only through the log,
// batched: nothing changes before the flush; one window gives at most one
// ClearHoldings and one withdrawals-only PlaceBatch.
func TestKVApplierProposesBatchedCommands(t *testing.T) {
	dec := decider.New(decider.Options{Policy: engine.Policy{BlockChars: 4, Threshold: 0.3, BalanceAbsThreshold: 100, BalanceRelThreshold: 100},
		MaxEntries: 10_000, InlineEvict: true, Rand: rand.New(rand.NewPCG(1, 2))})
	st := state.New(dec)
	var logIndex uint64
	var cmds []*cartv1.RaftCommand
	apply := func(_ context.Context, cmd *cartv1.RaftCommand) error {
		b, err := state.Encode(cmd)
		if err != nil {
			return err
		}
		logIndex++
		cmds = append(cmds, cmd)
		_, err = st.Apply(logIndex, b)
		return err
	}
	ctx := context.Background()
	if err := apply(ctx, &cartv1.RaftCommand{Body: &cartv1.RaftCommand_SetWorkers{SetWorkers: &cartv1.SetWorkersCommand{
		Workers: []*cartv1.WorkerSpec{{Url: "a"}, {Url: "b"}}}}}); err != nil {
		t.Fatal(err)
	}
	hashes := func(text string) []uint64 { return index.Hash(nil, "m", []byte(text), 4) }
	place := func(w, text string, at int64) {
		other := map[string]string{"a": "b", "b": "a"}[w]
		var d engine.Decision
		var err error
		dec.Do(decider.OpRoute, func(eng *engine.Engine) {
			d, err = eng.Choose(engine.Request{Hashes: hashes(text), KeyLen: len(text), Exclude: []string{other}}, at)
		})
		if err != nil || d.Worker != w {
			t.Fatalf("place on %s: %+v %v", w, d, err)
		}
	}
	holds := func(w, text string) int {
		var n int
		dec.Do(decider.OpRead, func(eng *engine.Engine) {
			var m index.Match
			eng.Index().Lookup(hashes(text), &m)
			id, _ := eng.WorkerIDOf(w)
			n = m.BlocksFor(index.WorkerID(id))
		})
		return n
	}
	old, recent := "0123456789abcdef", "ghijklmnopqrstuv" // 4 blocks each
	place("a", old, 1)
	place("a", recent, 2)
	place("b", old, 3) // the shared entries are now the index's most recent

	app := newKVApplier(dec, apply, slog.New(slog.DiscardHandler))
	// The engine holds 4 blocks after evicting: a's oldest 4 must go. The
	// first report finds a unmodelled: it leaves the seed to the seeding
	// loop (TestKVApplierRunSeedsAndStops), not seeding on the stream's
	// goroutine, and the trim comes at the seed's end.
	app.ApplyKVReport("a", engine.KVReport{Synced: true, OccupiedBlocks: 4, CapacityBlocks: 8, Evicted: true})
	var seeding bool
	dec.Do(decider.OpRead, func(eng *engine.Engine) { seeding = eng.Seeding() })
	if !seeding {
		t.Fatal("the first report of an unmodelled worker started no seed, or ran it on the report's goroutine")
	}
	dec.SeedModels(ctx, app.addTrim) // what run's seeding loop does
	app.ApplyKVReport("a", engine.KVReport{Synced: true, OccupiedBlocks: 4, CapacityBlocks: 8, Evicted: true})
	if holds("a", old) != 4 {
		t.Fatal("the index changed before the correction was committed")
	}
	n := len(cmds)
	app.flush(ctx)
	if len(cmds) != n+1 || cmds[n].GetPlaceBatch() == nil || len(cmds[n].GetPlaceBatch().GetPlacements()) != 0 || len(cmds[n].GetPlaceBatch().GetWithdrawals()[0].GetBlockHashes()) != 4 {
		t.Fatalf("flush proposed %v", cmds[n:])
	}
	if holds("a", old) != 0 || holds("a", recent) != 4 || holds("b", old) != 4 {
		t.Fatalf("after the trim: a old %d, a recent %d, b old %d", holds("a", old), holds("a", recent), holds("b", old))
	}

	app.ClearHoldings("b")
	app.ClearHoldings("a")
	app.ClearHoldings("a")
	n = len(cmds)
	app.flush(ctx)
	if len(cmds) != n+1 || !cmds[n].GetIgnorable() || len(cmds[n].GetClearHoldings().GetWorkers()) != 2 {
		t.Fatalf("flush proposed %v", cmds[n:])
	}
	if holds("a", recent) != 0 || holds("b", old) != 0 {
		t.Fatal("holdings survived the clear")
	}
	n = len(cmds)
	app.flush(ctx)
	if len(cmds) != n {
		t.Fatalf("an empty window proposed %v", cmds[n:])
	}
}

// run's seeding loop fills a worker's model after its first report, and
// run returns (the loop with it) when leadership ends.
func TestKVApplierRunSeedsAndStops(t *testing.T) {
	dec := decider.New(decider.Options{Policy: engine.Policy{BlockChars: 4, Threshold: 0.3, BalanceAbsThreshold: 100, BalanceRelThreshold: 100},
		MaxEntries: 100_000, Rand: rand.New(rand.NewPCG(1, 2))})
	dec.SetWorkers([]engine.WorkerSpec{{URL: "a"}})
	dec.Do(decider.OpRead, func(eng *engine.Engine) {
		for i := range 20_000 {
			eng.ApplyPlacement("a", []uint64{uint64(i) + 1}, int64(i))
		}
	})
	app := newKVApplier(dec, func(context.Context, *cartv1.RaftCommand) error { return nil }, slog.New(slog.DiscardHandler))
	app.ApplyKVReport("a", engine.KVReport{Synced: true, CapacityBlocks: 50_000})
	var seeding bool
	dec.Do(decider.OpRead, func(eng *engine.Engine) { seeding = eng.Seeding() })
	if !seeding {
		t.Fatal("the first report of an unmodelled worker started no seed")
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); app.run(ctx) }()
	testkit.WaitFor(t, 10*time.Second, "the seed finished", func() bool {
		var seeding bool
		dec.Do(decider.OpRead, func(eng *engine.Engine) { seeding = eng.Seeding() })
		return !seeding
	})
	cancel()
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after its context ended")
	}
}
