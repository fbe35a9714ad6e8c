package service

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/cartrouter/cart/controlplane/cpclient"
	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/raftnode"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
	"github.com/cartrouter/cart/internal/testkit"
)

// reasonOf is where txt would route now, without taking load.
func reasonOf(t *testing.T, cp *testCP, txt string) string {
	t.Helper()
	return route(t, cp.router(), &cartv1.RouteRequest{Model: "m", Text: txt, DryRun: true}).GetReason()
}

// wantReason fails the test when got, the reason a prompt routes with, is
// not want.
func wantReason(t *testing.T, got, want, what string) {
	t.Helper()
	if got != want {
		t.Fatalf("%s: routes as %s, want %s", what, got, want)
	}
}

// newHeldCP is a leader whose placement batches go out only when the test
// calls flushBatch.
func newHeldCP(t testing.TB) *testCP {
	return newTestCP(t, cpConfig{leader: true, opts: func(o *Options) { o.PlacementBatch = time.Hour }})
}

// heldWith is leaderWith on a held leader (newHeldCP).
func heldWith(t *testing.T, workers ...string) (*testCP, cartv1connect.RouterServiceClient) {
	t.Helper()
	cp := newHeldCP(t)
	cp.addWorkers(t, workers...)
	return cp, cp.router()
}

// flushBatch proposes the placement window now.
func (cp *testCP) flushBatch() { cp.core.batch.flush(context.Background()) }

// A batch that fails to commit takes its placements out of the leader's
// index again, and the window queued behind it with them.
func TestFailedBatchWithdrawsItsPlacements(t *testing.T) {
	cp, rc := heldWith(t, w1, w2)
	kept, lost := text(64, 30), text(64, 31)
	liveRoute(t, rc, kept)
	cp.flushBatch()
	liveRoute(t, rc, lost)
	wantReason(t, reasonOf(t, cp, lost), "cache_hit", "before the flush")
	cp.node.setApplyErr(raftnode.ErrNotLeader)
	cp.flushBatch()
	wantReason(t, reasonOf(t, cp, lost), "cache_miss", "placement of a failed batch")
	wantReason(t, reasonOf(t, cp, kept), "cache_hit", "committed placement after a later batch failed")
	wantReason(t, replayReason(t, cp, kept), "cache_hit", "replayed log")
	cp.node.setApplyErr(nil)
	// The failed batch is forgotten: a later batch carries only new work.
	liveRoute(t, rc, text(64, 32))
	cp.flushBatch()
	if b := cp.node.placeBatches(); len(b) != 2 || len(b[1].GetPlacements()) != 1 {
		t.Fatalf("place batches = %v", b)
	}
}

// A withdrawal (undelivered request) that fails to commit is undone too:
// the rest of the cluster still holds the placement it withdrew.
func TestFailedBatchRestoresItsWithdrawals(t *testing.T) {
	cp, rc := heldWith(t, w1, w2)
	txt := text(64, 33)
	d := liveRoute(t, rc, txt)
	cp.flushBatch()
	settle(t, rc, d, false)
	wantReason(t, reasonOf(t, cp, txt), "cache_miss", "after the withdrawal")
	cp.node.setApplyErr(raftnode.ErrNotLeader)
	cp.flushBatch()
	wantReason(t, reasonOf(t, cp, txt), "cache_hit", "after a failed withdrawal, as on the log")
	wantReason(t, replayReason(t, cp, txt), "cache_hit", "replayed log")
}

// What a committed entry of another proposer decided after a pending
// change is the log's word: undoing the failed batch must not touch it.
func TestFailedBatchKeepsWhatALaterCommitSet(t *testing.T) {
	cp, rc := heldWith(t, w1, w2)
	txt, other := text(64, 34), text(64, 35)
	d := liveRoute(t, rc, txt)
	liveRoute(t, rc, other)
	// The same placement, committed by someone else (a new leader).
	foreign := &cartv1.RaftCommand{Ignorable: true, RequestId: "batch-elsewhere-1", Body: &cartv1.RaftCommand_PlaceBatch{PlaceBatch: &cartv1.PlaceBatchCommand{
		Placements: []*cartv1.Placement{{Worker: d.GetWorker(), BlockHashes: hashes("m", txt), AtUnixNanos: 1}}}}}
	if _, err := cp.node.Apply(context.Background(), foreign); err != nil {
		t.Fatal(err)
	}
	cp.node.setApplyErr(raftnode.ErrNotLeader)
	cp.flushBatch()
	wantReason(t, reasonOf(t, cp, txt), "cache_hit", "placement the log holds, after the undo")
	wantReason(t, reasonOf(t, cp, other), "cache_miss", "uncommitted placement")
}

// A decision that raced the step-down is queued after the last flush:
// it is never proposed, so it is undone.
func TestDiscardUndoesTheWindow(t *testing.T) {
	cp := newHeldCP(t)
	cp.addWorkers(t, w1)
	txt := text(64, 36)
	route(t, cp.router(), &cartv1.RouteRequest{Model: "m", Text: txt, DataplaneId: "dp1"})
	cp.core.batch.discard()
	wantReason(t, reasonOf(t, cp, txt), "cache_miss", "discarded placement")
}

func TestWriteOutcomeUnknown(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true})
	cp.setMember(t, "n2", "http://n2.test:7070")
	ctx := context.Background()
	add := func() error {
		_, err := cp.admin().AddWorker(ctx, connect.NewRequest(&cartv1.AddWorkerRequest{Worker: &cartv1.Worker{Url: w1}}))
		return err
	}
	for _, leader := range []string{"", "n2"} {
		cp.node.setLeader(true, leader)
		cp.node.setApplyErr(errors.Join(raftnode.ErrNotLeader, raftnode.ErrOutcomeUnknown))
		ce := wantCode(t, add(), connect.CodeAborted)
		if ce.Meta().Get(cpclient.HeaderWriteOutcome) != "unknown" {
			t.Fatalf("leader %q: meta %v", leader, ce.Meta())
		}
		if want := map[string]string{"": "", "n2": "http://n2.test:7070"}[leader]; ce.Meta().Get(cpclient.HeaderLeaderURL) != want {
			t.Fatalf("leader %q: leader URL %q", leader, ce.Meta().Get(cpclient.HeaderLeaderURL))
		}
	}
	// Gave up waiting while still leading: unknown as well.
	cp.node.setLeader(true, "n1")
	cp.node.setApplyErr(raftnode.ErrOutcomeUnknown)
	wantCode(t, add(), connect.CodeAborted)
	// A definite refusal stays definite.
	cp.node.setLeader(true, "")
	cp.node.setApplyErr(raftnode.ErrNotLeader)
	wantCode(t, add(), connect.CodeUnavailable)
}

// A follower that loses the forwarded write's answer after sending it
// cannot say the write was not done; one that could not even connect can.
func TestForwardedWriteWithoutAnswer(t *testing.T) {
	follower := newTestCP(t, cpConfig{id: "n1"})
	ctx := context.Background()
	add := func() error {
		_, err := follower.admin().AddWorker(ctx, connect.NewRequest(&cartv1.AddWorkerRequest{Worker: &cartv1.Worker{Url: w1}}))
		return err
	}
	reached := make(chan struct{}, 1)
	dropper := testkit.H2CServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case reached <- struct{}{}:
		default:
		}
		panic(http.ErrAbortHandler) // the leader died mid-call
	}))
	dropper.Start()
	defer dropper.Close()
	follower.setMember(t, "n2", dropper.URL)
	follower.node.setLeader(false, "n2")
	ce := wantCode(t, add(), connect.CodeAborted)
	if ce.Meta().Get(cpclient.HeaderWriteOutcome) != "unknown" || !strings.Contains(ce.Message(), "forwarding") {
		t.Fatalf("lost forward: %v (meta %v)", ce, ce.Meta())
	}
	<-reached

	closed := httptest.NewServer(http.NotFoundHandler())
	url := closed.URL
	closed.Close()
	follower.setMember(t, "n2", url)
	wantCode(t, add(), connect.CodeUnavailable)
}

// A snapshot stands for the log up to its applied index: taken on a leader
// with placements (and withdrawals) still uncommitted, it must leave them
// out, or a restart from it, or a follower installing it, keeps them.
func TestSnapshotLeavesOutUncommittedChanges(t *testing.T) {
	cp, rc := heldWith(t, w1, w2)
	committed, withdrawn, pending := text(64, 40), text(64, 41), text(64, 42)
	liveRoute(t, rc, committed)
	d := liveRoute(t, rc, withdrawn)
	cp.flushBatch()
	settle(t, rc, d, false)
	liveRoute(t, rc, pending)

	var buf bytes.Buffer
	if err := cp.st.Capture().Write(&buf); err != nil {
		t.Fatal(err)
	}
	fresh := newTestCP(t, cpConfig{id: "restored", leader: true})
	if err := fresh.st.Restore(&buf); err != nil {
		t.Fatal(err)
	}
	for txt, want := range map[string]string{committed: "cache_hit", withdrawn: "cache_hit", pending: "cache_miss"} {
		if r := reasonOf(t, fresh, txt); r != want {
			t.Errorf("restored snapshot routes %q as %s, want %s (as the log says)", txt[:12], r, want)
		}
	}
	// The leader's own index is untouched by the snapshot.
	wantReason(t, reasonOf(t, cp, pending), "cache_hit", "leader's pending placement")
	wantReason(t, reasonOf(t, cp, withdrawn), "cache_miss", "leader's withdrawal, after the snapshot")
}

// Response origins of a batch that fails to commit are proposed again (they
// are facts, not decisions), but while commits keep failing the queue keeps
// only the newest maxPendingOrigins.
func TestFailedBatchKeepsBoundedOrigins(t *testing.T) {
	cp := newHeldCP(t)
	// A batcher of the test's own, not the core's: the core's run loop
	// flushes as soon as a queue reaches the batch size, concurrently with
	// the test's flushes, and only one flush may be in flight.
	b := newBatcher(cp.node, time.Hour, cp.core.batch.max, cp.core.log, cp.dec)
	queue := func(n int, from uint64) {
		os := make([]*cartv1.ResponseOrigin, n)
		for i := range n {
			os[i] = &cartv1.ResponseOrigin{IdHash: from + uint64(i), Worker: w1}
		}
		b.Origins(os)
	}
	cp.node.setApplyErr(raftnode.ErrNotLeader)
	queue(3, 1)
	b.flush(context.Background())
	var got int
	cp.dec.Do(decider.OpRead, func(*engine.Engine) { got = len(b.origins) })
	if got != 3 {
		t.Fatalf("after a failed batch %d origins are queued, want the 3 again", got)
	}
	limit := maxPendingOrigins(b.max)
	for i := range 4 {
		queue(limit, uint64(1000+i*limit))
		b.flush(context.Background())
	}
	var newest uint64
	cp.dec.Do(decider.OpRead, func(*engine.Engine) { got, newest = len(b.origins), b.origins[len(b.origins)-1].GetIdHash() })
	if got != limit || newest != uint64(1000+4*limit-1) {
		t.Fatalf("after repeated failures %d origins queued (newest %d), want the newest %d", got, newest, limit)
	}
	cp.node.setApplyErr(nil)
	b.flush(context.Background())
	if bs := cp.node.placeBatches(); len(bs) == 0 || len(bs[len(bs)-1].GetResponseOrigins()) != limit {
		t.Fatalf("the committed batch does not carry the queued origins")
	}
}

// ledgerHolds counts the ledger's lock holds so far.
func ledgerHolds(t *testing.T, cp *testCP) uint64 {
	t.Helper()
	var m dto.Metric
	hv := cp.core.dec.Collectors()[0].(*prometheus.HistogramVec)
	if err := hv.WithLabelValues(decider.OpLedger.String()).(prometheus.Histogram).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// A large failed window is undone a chunk per lock hold, not in one: a
// proposal that stalled for seconds queued that many decisions behind it.
func TestFailedBatchUndoneInChunks(t *testing.T) {
	cp, rc := heldWith(t, w1, w2)
	var txts []string
	blocks := 0
	for i := 0; blocks < 4*undoChunk; i++ {
		txts = append(txts, text(100*testBlockChars, 1000+i))
		liveRoute(t, rc, txts[i])
		blocks += 100
	}
	cp.node.setApplyErr(raftnode.ErrNotLeader)
	before := ledgerHolds(t, cp)
	cp.flushBatch()
	// take and settle are one hold each; the undo at least one per chunk.
	if holds := ledgerHolds(t, cp) - before; holds < 2+uint64(blocks/undoChunk) {
		t.Fatalf("the undo of %d blocks took %d ledger holds, want at least %d", blocks, holds, 2+blocks/undoChunk)
	}
	for i, txt := range txts {
		wantReason(t, reasonOf(t, cp, txt), "cache_miss", fmt.Sprintf("placement %d of the failed batch", i))
	}
}

// A decision made between two steps of an undo sets what the log will
// say (it is replicated in the next window): the rest of the undo must
// not revert it. Here the undo queue holds, in revert order, a
// placement, a withdrawal of an older placement and that older
// placement, all of one prompt on the only worker.
func TestDecisionBetweenUndoStepsStands(t *testing.T) {
	cp, rc := heldWith(t, w1)
	b := cp.core.batch
	txt := text(8*testBlockChars, 50)
	d0 := liveRoute(t, rc, txt) // P0
	var batch *ownBatch
	cp.core.dec.Do(decider.OpLedger, func(eng *engine.Engine) { batch, _, _ = b.take(eng) })
	settle(t, rc, d0, false) // W0: P0 is in flight, so withdrawn by an op
	liveRoute(t, rc, txt)    // P1
	cp.core.dec.Do(decider.OpLedger, func(eng *engine.Engine) {
		b.settle(eng, batch, nil, 1, 0, errors.New("not committed"))
		if n := len(b.undoQ); n != 3 {
			t.Errorf("undo queue of %d ops, want 3", n)
		}
		b.undoStep(eng, 1) // reverts P1 only
	})
	wantReason(t, reasonOf(t, cp, txt), "cache_miss", "after the first undo step")
	liveRoute(t, rc, txt) // P2, made between the steps
	cp.core.dec.Do(decider.OpLedger, func(*engine.Engine) {
		if len(b.fence) == 0 {
			t.Error("P2 not fenced against the rest of the undo")
		}
	})
	b.drainUndo()
	// Drained, nothing pending is as old as the fences: the table empties
	// rather than growing with every undo.
	cp.core.dec.Do(decider.OpLedger, func(*engine.Engine) {
		if n := len(b.fence); n != 0 {
			t.Errorf("%d fences left after the undo drained", n)
		}
	})
	wantReason(t, reasonOf(t, cp, txt), "cache_hit", "the decision made during the undo")
	cp.flushBatch()
	wantReason(t, replayReason(t, cp, txt), "cache_hit", "replayed log")
}

// An undo reverts exactly the blocks of an op no fence at or past its seq
// covers, whichever of them are fenced: none, the first, inner ones, all.
func TestUnfencedLeavesOutFencedBlocks(t *testing.T) {
	op := pendingOp{worker: "w", hashes: []uint64{1, 2, 3, 4}, seq: 10}
	cases := []struct {
		name  string
		fence map[fenceKey]uint64
		want  []uint64
	}{
		{"no fence", nil, []uint64{1, 2, 3, 4}},
		{"older fences and other workers", map[fenceKey]uint64{{"w", 1}: 9, {"v", 2}: 20}, []uint64{1, 2, 3, 4}},
		{"first", map[fenceKey]uint64{{"w", 1}: 10}, []uint64{2, 3, 4}},
		{"inner", map[fenceKey]uint64{{"w", 2}: 11, {"w", 4}: 12}, []uint64{1, 3}},
		{"all", map[fenceKey]uint64{{"w", 1}: 10, {"w", 2}: 10, {"w", 3}: 10, {"w", 4}: 10}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := &batcher{fence: c.fence}
			if got := b.unfenced(op); !slices.Equal(got, c.want) {
				t.Fatalf("unfenced = %v, want %v", got, c.want)
			}
			if !slices.Equal(op.hashes, []uint64{1, 2, 3, 4}) {
				t.Fatalf("op's hashes modified: %v", op.hashes)
			}
		})
	}
}
