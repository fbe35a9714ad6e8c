package service

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
)

// testClock is a decision clock the test moves by hand.
type testClock struct{ ns atomic.Int64 }

func (c *testClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *testClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// touchLeader is a held leader (windows cut by flushBatch) deciding on clk,
// with workers of cache capacity tokens (0: none).
func touchLeader(t *testing.T, clk *testClock, tokens int64, workers ...string) (*testCP, cartv1connect.RouterServiceClient) {
	t.Helper()
	clk.ns.Store(time.Unix(1000, 0).UnixNano())
	cp := newTestCP(t, cpConfig{leader: true, opts: func(o *Options) { o.PlacementBatch = time.Hour }, dec: func(o *decider.Options) { o.Now = clk.now }})
	for _, u := range workers {
		cmd := &cartv1.RaftCommand{Body: &cartv1.RaftCommand_UpsertWorker{UpsertWorker: &cartv1.UpsertWorkerCommand{
			Worker: &cartv1.WorkerSpec{Url: u, CacheCapacityTokens: tokens}}}}
		if _, err := cp.node.Apply(context.Background(), cmd); err != nil {
			t.Fatal(err)
		}
	}
	return cp, cp.router()
}

// follower is a node that applied the leader's log so far.
func follower(t *testing.T, leader *testCP) *testCP {
	t.Helper()
	f := newTestCP(t, cpConfig{id: "follower"})
	for _, c := range leader.node.commands() {
		if _, err := f.node.Apply(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// recency is, for each of hs, the block's LRU time in cp's index and
// worker's holding time (-1: absent).
func recency(cp *testCP, worker string, hs []uint64) (used, at []int64) {
	used, at = make([]int64, len(hs)), make([]int64, len(hs))
	cp.dec.Do(decider.OpRead, func(eng *engine.Engine) {
		wid, _ := eng.WorkerIDOf(worker)
		byHash := map[uint64]int64{}
		eng.Index().Walk(func(h uint64, u int64, _ []index.Holder) bool { byHash[h] = u; return true })
		for i, h := range hs {
			used[i], at[i] = -1, -1
			if u, ok := byHash[h]; ok {
				used[i] = u
			}
			if a, ok := eng.Index().HolderAt(h, index.WorkerID(wid)); ok {
				at[i] = a
			}
		}
	})
	return used, at
}

func allTouches(cp *testCP) []*cartv1.Placement {
	var out []*cartv1.Placement
	for _, b := range cp.node.placeBatches() {
		out = append(out, b.GetTouches()...)
	}
	return out
}

func wantAll(t *testing.T, what string, got []int64, want int64) {
	t.Helper()
	for i, g := range got {
		if g != want {
			t.Fatalf("%s of block %d = %d, want %d (all: %v)", what, i, g, want, got)
		}
	}
}

// A hit on a prefix placed long ago refreshes its recency on followers as
// on the leader: a new leader would otherwise evict a hot prefix first.
func TestTouchRefreshesFollowerRecency(t *testing.T) {
	var clk testClock
	cp, rc := touchLeader(t, &clk, 0, w1)
	txt := text(64, 40)
	hs := hashes("m", txt)
	liveRoute(t, rc, txt)
	cp.flushBatch()
	clk.advance(10 * time.Second)
	hitAt := clk.now().UnixNano()
	wantReason(t, liveRoute(t, rc, txt).GetReason(), "cache_hit", "second route")
	cp.flushBatch()

	ts := allTouches(cp)
	if len(ts) != 1 || ts[0].GetWorker() != w1 || !slices.Equal(ts[0].GetBlockHashes(), hs) || ts[0].GetAtUnixNanos() != hitAt {
		t.Fatalf("touches = %v, want one of %v at %d", ts, hs, hitAt)
	}
	lu, la := recency(cp, w1, hs)
	wantAll(t, "leader used", lu, hitAt)
	wantAll(t, "leader holding", la, hitAt)
	f := follower(t, cp)
	fu, fa := recency(f, w1, hs)
	wantAll(t, "follower used", fu, hitAt)
	wantAll(t, "follower holding", fa, hitAt)
}

// With capacity models, a follower evicts the block the leader evicted,
// not the touched prefix.
func TestTouchKeepsFollowerCapacityOrder(t *testing.T) {
	var clk testClock
	// 32 tokens = 8 blocks of 16 characters: two 64-character prompts.
	cp, rc := touchLeader(t, &clk, 32, w1)
	a, b, c := text(64, 41), text(64, 42), text(64, 43)
	liveRoute(t, rc, a)
	clk.advance(time.Second)
	liveRoute(t, rc, b)
	cp.flushBatch()
	clk.advance(10 * time.Second)
	wantReason(t, liveRoute(t, rc, a).GetReason(), "cache_hit", "a again")
	clk.advance(time.Second)
	liveRoute(t, rc, c)
	cp.flushBatch()
	f := follower(t, cp)
	for _, n := range []*testCP{cp, f} {
		for _, tc := range []struct {
			txt  string
			held bool
		}{{a, true}, {b, false}, {c, true}} {
			_, at := recency(n, w1, hashes("m", tc.txt))
			for i, x := range at {
				if (x >= 0) != tc.held {
					t.Fatalf("%s: block %d of %q held=%v, want %v", n.node.id, i, tc.txt[:12], x >= 0, tc.held)
				}
			}
		}
	}
}

// Hits in one window on the same worker and prefix replicate as one touch
// at the newest time.
func TestTouchesMergeWithinAWindow(t *testing.T) {
	var clk testClock
	cp, rc := touchLeader(t, &clk, 0, w1)
	txt := text(64, 44)
	liveRoute(t, rc, txt)
	cp.flushBatch()
	clk.advance(10 * time.Second)
	liveRoute(t, rc, txt)
	clk.advance(300 * time.Millisecond)
	liveRoute(t, rc, txt)
	last := clk.now().UnixNano()
	cp.flushBatch()
	if ts := allTouches(cp); len(ts) != 1 || ts[0].GetAtUnixNanos() != last {
		t.Fatalf("touches = %v, want one at %d", ts, last)
	}
	if q, m := cp.core.batch.Touches(touchQueued), cp.core.batch.Touches(touchMerged); q != 1 || m != 1 {
		t.Fatalf("queued %d merged %d, want 1 and 1", q, m)
	}
}

// Across windows a (worker, prefix) is touched at most once per
// touchInterval.
func TestTouchesRateLimitedAcrossWindows(t *testing.T) {
	var clk testClock
	cp, rc := touchLeader(t, &clk, 0, w1)
	txt := text(64, 45)
	liveRoute(t, rc, txt)
	cp.flushBatch()
	var want []int64
	for _, step := range []struct {
		after   time.Duration
		touched bool
	}{
		{10 * time.Second, true},
		{touchInterval / 2, false},
		{touchInterval / 2, true}, // a full interval since the last touch
		{touchInterval / 4, false},
		{touchInterval, true},
	} {
		clk.advance(step.after)
		wantReason(t, liveRoute(t, rc, txt).GetReason(), "cache_hit", "repeat")
		cp.flushBatch()
		if step.touched {
			want = append(want, clk.now().UnixNano())
		}
	}
	var got []int64
	for _, tp := range allTouches(cp) {
		got = append(got, tp.GetAtUnixNanos())
	}
	if !slices.Equal(got, want) {
		t.Fatalf("touch times = %v, want %v", got, want)
	}
	if n := cp.core.batch.Touches(touchLimited); n != 2 {
		t.Fatalf("limited = %d, want 2", n)
	}
}

// The table of recent touches stays within two generations of
// maxTouchKeys however many distinct prefixes are hit within an interval.
func TestTouchTableBounded(t *testing.T) {
	var clk testClock
	cp, _ := touchLeader(t, &clk, 0, w1)
	b := cp.core.batch
	at := clk.now()
	cp.dec.Do(decider.OpLedger, func(eng *engine.Engine) {
		for i := range 3 * maxTouchKeys {
			if i%1000 == 0 {
				b.dropTouches() // a window flushed: within its block budget
			}
			b.Touch(eng, w1, []uint64{uint64(i) + 1}, at)
			if n := len(b.recent) + len(b.older); n > 2*maxTouchKeys {
				t.Fatalf("after %d touches the table holds %d keys", i+1, n)
			}
		}
		// The newest key is still remembered.
		b.dropTouches()
		b.Touch(eng, w1, []uint64{3 * maxTouchKeys}, at)
	})
	if n := b.Touches(touchLimited); n != 1 {
		t.Fatalf("limited = %d, want the newest key limited", n)
	}
}

// A window's touches are hints: a failed batch undoes nothing of them, and
// the touches queued behind it go with its undone placements (they may
// refresh blocks those placed).
func TestFailedBatchDropsTheWindowsTouches(t *testing.T) {
	var clk testClock
	cp, rc := touchLeader(t, &clk, 0, w1)
	txt := text(64, 46)
	liveRoute(t, rc, txt)
	b := cp.core.batch
	var batch *ownBatch
	var origins []*cartv1.ResponseOrigin
	cp.dec.Do(decider.OpLedger, func(eng *engine.Engine) { batch, origins, _ = b.take(eng) })
	clk.advance(10 * time.Second)
	wantReason(t, liveRoute(t, rc, txt).GetReason(), "cache_hit", "before the failure")
	if len(b.touches) != 1 {
		t.Fatalf("window touches = %d, want 1", len(b.touches))
	}
	cp.dec.Do(decider.OpLedger, func(eng *engine.Engine) { b.settle(eng, batch, origins, 1, 0, errors.New("not committed")) })
	b.drainUndo()
	wantReason(t, reasonOf(t, cp, txt), "cache_miss", "after the failed batch")
	cp.flushBatch()
	if ts := allTouches(cp); len(ts) != 0 {
		t.Fatalf("touches replicated after the failure: %v", ts)
	}
}

// The leader exports what touches cost the log next to placements.
func TestTouchMetrics(t *testing.T) {
	var clk testClock
	cp, rc := touchLeader(t, &clk, 0, w1)
	txt := text(64, 47) // 4 blocks
	liveRoute(t, rc, txt)
	cp.flushBatch()
	clk.advance(10 * time.Second)
	liveRoute(t, rc, txt)
	liveRoute(t, rc, txt)
	cp.flushBatch()
	resp, err := cp.client.Get(cp.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`cart_cp_touches_total{outcome="queued"} 1`,
		`cart_cp_touches_total{outcome="merged"} 1`,
		`cart_cp_batches_proposed_total 2`,
		`cart_cp_batch_records_total{kind="placement"} 1`,
		`cart_cp_batch_records_total{kind="touch"} 1`,
		`cart_cp_batch_blocks_total{kind="placement"} 4`,
		`cart_cp_batch_blocks_total{kind="touch"} 4`,
	} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// A hit on a placement still in its window, whose request then turns out
// undelivered: the placement is withdrawn before it was ever replicated,
// and the hit's touch must not bring it back on followers. The log,
// replayed, routes as the leader does.
func TestTouchOfAPlacementWithdrawnInItsWindow(t *testing.T) {
	cp, rc := heldWith(t, w1)
	txt := text(64, 77)
	first := liveRoute(t, rc, txt)
	wantReason(t, liveRoute(t, rc, txt).GetReason(), "cache_hit", "second route")
	settle(t, rc, first, false)
	cp.flushBatch()
	if leader, replay := reasonOf(t, cp, txt), replayReason(t, cp, txt); leader != replay {
		t.Fatalf("leader routes it as %s, the replayed log as %s", leader, replay)
	}
}

// A worker's engine restarts (ClearHoldings, committed at once) between a
// decision and its window's flush: neither the window's placement nor a
// hit's touch may give followers the holdings the clear took.
func TestWindowAfterClearHoldings(t *testing.T) {
	for _, hit := range []bool{false, true} {
		var clk testClock
		cp, rc := touchLeader(t, &clk, 0, w1)
		txt := text(64, 79)
		liveRoute(t, rc, txt)
		if hit {
			cp.flushBatch()
			clk.advance(10 * time.Second)
			wantReason(t, liveRoute(t, rc, txt).GetReason(), "cache_hit", "hit")
		}
		clear := &cartv1.RaftCommand{Ignorable: true, Body: &cartv1.RaftCommand_ClearHoldings{ClearHoldings: &cartv1.ClearHoldingsCommand{Workers: []string{w1}}}}
		if _, err := cp.node.Apply(context.Background(), clear); err != nil {
			t.Fatal(err)
		}
		cp.flushBatch()
		if leader, replay := reasonOf(t, cp, txt), replayReason(t, cp, txt); leader != replay {
			t.Fatalf("hit %v: leader routes it as %s, the replayed log as %s", hit, leader, replay)
		}
	}
}

// A window's touches carry at most maxTouchBlocksPerWindow blocks: a long
// chat's turns each touch their whole history, which neither the merge nor
// the interval holds back. Past the budget they are dropped and counted;
// the next window has the budget again.
func TestTouchBlockBudget(t *testing.T) {
	var clk testClock
	cp, _ := touchLeader(t, &clk, 0, w1)
	b := cp.core.batch
	at := clk.now()
	path := func(turn int) []uint64 {
		p := make([]uint64, 1000)
		for i := range p {
			p[i] = uint64(turn*1000 + i + 1)
		}
		return p
	}
	cp.dec.Do(decider.OpLedger, func(eng *engine.Engine) {
		for turn := range 5 {
			b.Touch(eng, w1, path(turn), at)
		}
		if len(b.touches) != 4 || b.touchBl != 4000 {
			t.Errorf("window holds %d touches of %d blocks, want 4 of 4000", len(b.touches), b.touchBl)
		}
		b.dropTouches()
		b.Touch(eng, w1, path(5), at)
	})
	if q, o := b.Touches(touchQueued), b.Touches(touchOverBudget); q != 5 || o != 1 {
		t.Fatalf("queued %d, over budget %d; want 5 and 1", q, o)
	}
}
