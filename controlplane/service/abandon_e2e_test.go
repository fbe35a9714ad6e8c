package service

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/dataplane/remote"
	"github.com/cartrouter/cart/dataplane/router"
	"github.com/cartrouter/cart/internal/testkit"
)

// A real data-plane router against a leader that is sometimes too slow for
// its route timeout (the routing lock held for longer than the timeout, as
// a snapshot or a big batch would): the data plane falls back locally for
// those requests, and once every request is done the leader holds no
// ticket and no load, well within the load lease. Before, every decision
// the data plane gave up on stayed for an hour with its placement.
func TestTimedOutRoutesLeaveNoTickets(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true}) // load lease 1 minute: not what settles them
	cp.addWorkers(t, w1, w2)
	client := testkit.H2CClient()
	t.Cleanup(client.CloseIdleConnections)
	var timeouts atomic.Int64
	dp := remote.New(remote.Options{
		ID: "dp1", ControlPlanes: []string{cp.url}, RouteTimeout: 3 * time.Millisecond,
		SyncInterval: time.Hour, FlushInterval: 5 * time.Millisecond, HTTPClient: client,
		BlockChars: testBlockChars, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnFallback: func(cause string) {
			if cause == "timeout" {
				timeouts.Add(1)
			}
		},
	})
	if err := dp.SyncOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	bg.Add(2)
	go func() { defer bg.Done(); dp.Run(ctx) }()
	go func() {
		// A leader that stalls now and then.
		defer bg.Done()
		for ctx.Err() == nil {
			cp.dec.Do(decider.OpRead, func(*engine.Engine) { time.Sleep(6 * time.Millisecond) })
			time.Sleep(4 * time.Millisecond)
		}
	}()
	defer func() { cancel(); bg.Wait() }()

	const clients, each = 6, 40
	var wg sync.WaitGroup
	var leaderDecided atomic.Int64
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				txt := text(64, c*1000+i)
				d, err := dp.Decide(context.Background(), &router.Request{Model: "m", Hashes: hashes("m", txt), KeyLen: len(txt)})
				if err != nil {
					t.Error(err)
					return
				}
				if d.FromLeader {
					leaderDecided.Add(1)
				}
				dp.Done(d, router.Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1})
			}
		}()
	}
	wg.Wait()
	t.Logf("%d routes: %d decided by the leader, %d timed out and routed locally", clients*each, leaderDecided.Load(), timeouts.Load())
	if timeouts.Load() == 0 {
		t.Fatal("no Route timed out: the test did not exercise abandoned decisions")
	}
	testkit.WaitFor(t, 5*time.Second, "every ticket settled and no load left", func() bool {
		l := cp.loads(t)
		return cp.unsettled() == 0 && l[w1] == 0 && l[w2] == 0
	})
	if n := cp.dropped(decider.DropAbandoned); n == 0 {
		t.Fatalf("no decision was undone as abandoned (%v)", n)
	}
}
