package service

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cartrouter/cart/controlplane/cpclient"
	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/raftnode"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// reasonOf is where txt would route now, without taking load.
func reasonOf(t *testing.T, cp *testCP, txt string) string {
	t.Helper()
	return route(t, cp.router(), &cartv1.RouteRequest{Model: "m", Text: txt, DryRun: true}).GetReason()
}

// A batch that fails to commit takes its placements out of the leader's
// index again, and the window queued behind it with them.
func TestFailedBatchWithdrawsItsPlacements(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true, opts: func(o *Options) { o.PlacementBatch = time.Hour }})
	cp.addWorkers(t, w1, w2)
	rc := cp.router()
	kept, lost := text(64, 30), text(64, 31)
	route(t, rc, &cartv1.RouteRequest{Model: "m", Text: kept, DataplaneId: "dp1"})
	cp.core.batch.flush(context.Background())
	route(t, rc, &cartv1.RouteRequest{Model: "m", Text: lost, DataplaneId: "dp1"})
	if r := reasonOf(t, cp, lost); r != "cache_hit" {
		t.Fatalf("before the flush: %s", r)
	}
	cp.node.setApplyErr(raftnode.ErrNotLeader)
	cp.core.batch.flush(context.Background())
	if r := reasonOf(t, cp, lost); r != "cache_miss" {
		t.Fatalf("placement of a failed batch still routes as %s", r)
	}
	if r := reasonOf(t, cp, kept); r != "cache_hit" {
		t.Fatalf("committed placement routes as %s after a later batch failed", r)
	}
	if r := replayReason(t, cp, kept); r != "cache_hit" {
		t.Fatalf("replayed log: %s", r)
	}
	cp.node.setApplyErr(nil)
	// The failed batch is forgotten: a later batch carries only new work.
	route(t, rc, &cartv1.RouteRequest{Model: "m", Text: text(64, 32), DataplaneId: "dp1"})
	cp.core.batch.flush(context.Background())
	if b := cp.node.placeBatches(); len(b) != 2 || len(b[1].GetPlacements()) != 1 {
		t.Fatalf("place batches = %v", b)
	}
}

// A withdrawal (undelivered request) that fails to commit is undone too:
// the rest of the cluster still holds the placement it withdrew.
func TestFailedBatchRestoresItsWithdrawals(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true, opts: func(o *Options) { o.PlacementBatch = time.Hour }})
	cp.addWorkers(t, w1, w2)
	rc := cp.router()
	txt := text(64, 33)
	d := route(t, rc, &cartv1.RouteRequest{Model: "m", Text: txt, DataplaneId: "dp1"})
	cp.core.batch.flush(context.Background())
	complete(t, rc, "dp1", &cartv1.Completion{Ticket: d.GetTicket(), Worker: d.GetWorker(), Delivered: false})
	if r := reasonOf(t, cp, txt); r != "cache_miss" {
		t.Fatalf("after the withdrawal: %s", r)
	}
	cp.node.setApplyErr(raftnode.ErrNotLeader)
	cp.core.batch.flush(context.Background())
	if r := reasonOf(t, cp, txt); r != "cache_hit" {
		t.Fatalf("failed withdrawal left the placement out: %s, want cache_hit as on the log", r)
	}
	if r := replayReason(t, cp, txt); r != "cache_hit" {
		t.Fatalf("replayed log: %s", r)
	}
}

// What a committed entry of another proposer decided after a pending
// change is the log's word: undoing the failed batch must not touch it.
func TestFailedBatchKeepsWhatALaterCommitSet(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true, opts: func(o *Options) { o.PlacementBatch = time.Hour }})
	cp.addWorkers(t, w1, w2)
	rc := cp.router()
	txt, other := text(64, 34), text(64, 35)
	d := route(t, rc, &cartv1.RouteRequest{Model: "m", Text: txt, DataplaneId: "dp1"})
	route(t, rc, &cartv1.RouteRequest{Model: "m", Text: other, DataplaneId: "dp1"})
	// The same placement, committed by someone else (a new leader).
	foreign := &cartv1.RaftCommand{Ignorable: true, RequestId: "batch-elsewhere-1", Body: &cartv1.RaftCommand_PlaceBatch{PlaceBatch: &cartv1.PlaceBatchCommand{
		Placements: []*cartv1.Placement{{Worker: d.GetWorker(), BlockHashes: hashes("m", txt), AtUnixNanos: 1}}}}}
	if _, err := cp.node.Apply(context.Background(), foreign); err != nil {
		t.Fatal(err)
	}
	cp.node.setApplyErr(raftnode.ErrNotLeader)
	cp.core.batch.flush(context.Background())
	if r := reasonOf(t, cp, txt); r != "cache_hit" {
		t.Fatalf("undo removed a placement the log holds: %s", r)
	}
	if r := reasonOf(t, cp, other); r != "cache_miss" {
		t.Fatalf("uncommitted placement survived: %s", r)
	}
}

// A decision that raced the step-down is queued after the last flush:
// it is never proposed, so it is undone.
func TestDiscardUndoesTheWindow(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true, opts: func(o *Options) { o.PlacementBatch = time.Hour }})
	cp.addWorkers(t, w1)
	txt := text(64, 36)
	route(t, cp.router(), &cartv1.RouteRequest{Model: "m", Text: txt, DataplaneId: "dp1"})
	cp.core.batch.discard()
	if r := reasonOf(t, cp, txt); r != "cache_miss" {
		t.Fatalf("discarded placement routes as %s", r)
	}
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
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	reached := make(chan struct{}, 1)
	dropper := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case reached <- struct{}{}:
		default:
		}
		panic(http.ErrAbortHandler) // the leader died mid-call
	}))
	dropper.Config.Protocols = &p
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
	cp := newTestCP(t, cpConfig{leader: true, opts: func(o *Options) { o.PlacementBatch = time.Hour }})
	cp.addWorkers(t, w1, w2)
	rc := cp.router()
	committed, withdrawn, pending := text(64, 40), text(64, 41), text(64, 42)
	route(t, rc, &cartv1.RouteRequest{Model: "m", Text: committed, DataplaneId: "dp1"})
	d := route(t, rc, &cartv1.RouteRequest{Model: "m", Text: withdrawn, DataplaneId: "dp1"})
	cp.core.batch.flush(context.Background())
	complete(t, rc, "dp1", &cartv1.Completion{Ticket: d.GetTicket(), Worker: d.GetWorker(), Delivered: false})
	route(t, rc, &cartv1.RouteRequest{Model: "m", Text: pending, DataplaneId: "dp1"})

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
	if r := reasonOf(t, cp, pending); r != "cache_hit" {
		t.Fatalf("leader lost its pending placement: %s", r)
	}
	if r := reasonOf(t, cp, withdrawn); r != "cache_miss" {
		t.Fatalf("leader's withdrawal undone by the snapshot: %s", r)
	}
}

// Response origins of a batch that fails to commit are proposed again (they
// are facts, not decisions), but while commits keep failing the queue keeps
// only the newest maxPendingOrigins.
func TestFailedBatchKeepsBoundedOrigins(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true, opts: func(o *Options) { o.PlacementBatch = time.Hour }})
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
