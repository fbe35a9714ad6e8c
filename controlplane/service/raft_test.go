package service

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"

	"github.com/cartrouter/cart/controlplane/cpclient"
	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/engine/enginetest"
	"github.com/cartrouter/cart/controlplane/health"
	"github.com/cartrouter/cart/controlplane/raftnode"
	"github.com/cartrouter/cart/controlplane/state"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
)

// raftCP is one control-plane node over a real Raft node on raft's
// in-memory transport, so partitions are a Disconnect away.
type raftCP struct {
	id    string
	addr  raft.ServerAddress
	trans *raft.InmemTransport
	dec   *decider.Decider
	st    *state.State
	core  *Core
	node  *raftnode.Node
}

type raftCluster struct {
	t     *testing.T
	nodes []*raftCP
}

// Raft timing for these tests: a leader cut off keeps believing it leads
// for one lease, long enough for a test to act on it even when a loaded
// machine deschedules the process for a while, and short enough to keep
// the tests at a few seconds.
var partitionTimeouts = raftnode.Timeouts{Heartbeat: 500 * time.Millisecond, Election: 500 * time.Millisecond, LeaderLease: 500 * time.Millisecond, Commit: 5 * time.Millisecond}

func newRaftCluster(t *testing.T, n int, opts ...func(*Options)) *raftCluster {
	t.Helper()
	c := &raftCluster{t: t}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for i := range n {
		addr, trans := raft.NewInmemTransport("")
		dec := decider.New(decider.Options{Policy: testPolicy, MaxEntries: 1 << 20, Rand: rand.New(rand.NewPCG(1, uint64(i))), LoadLease: time.Minute})
		st := state.New(dec)
		x := &raftCP{id: fmt.Sprintf("n%d", i+1), addr: addr, trans: trans, dec: dec, st: st}
		o := Options{
			NodeID:         x.id,
			BlockChars:     testBlockChars,
			PlacementBatch: 10 * time.Millisecond,
			PlacementMax:   512,
			Health:         health.Config{Endpoint: "/health", Interval: time.Second, Timeout: time.Second, FailureThreshold: 1, SuccessThreshold: 1},
			HealthClient:   &http.Client{Transport: okTransport{}},
			Logger:         log,
		}
		for _, f := range opts {
			f(&o)
		}
		x.core = New(o, dec, st)
		c.nodes = append(c.nodes, x)
	}
	c.heal()
	for i, x := range c.nodes {
		nd, err := raftnode.Start(raftnode.Config{
			NodeID: x.id, Bootstrap: i == 0, Transport: x.trans, Timeouts: &partitionTimeouts, Logger: log,
			Fatal: func(err error) { t.Errorf("%s: fatal: %v", x.id, err) },
		}, x.st, x.core.OnLeadership)
		if err != nil {
			t.Fatalf("start %s: %v", x.id, err)
		}
		x.node = nd
		x.core.SetNode(nd)
	}
	t.Cleanup(c.shutdown)
	first := c.nodes[0]
	testkit.WaitFor(t, 5*time.Second, "bootstrap leader", first.node.IsLeader)
	for _, x := range c.nodes[1:] {
		if err := first.node.AddVoter(context.Background(), x.id, string(x.addr)); err != nil {
			t.Fatalf("add voter %s: %v", x.id, err)
		}
	}
	// AddVoter returns once the leader committed the change, which a
	// lagging follower may not have yet. A test that then cuts the leader
	// off could leave the others unable to elect one: a node that does not
	// see itself (or the candidate) in the configuration refuses to vote.
	for _, x := range c.nodes {
		testkit.WaitFor(t, 10*time.Second, x.id+" sees all "+fmt.Sprint(n)+" voters", func() bool {
			f := x.node.Raft().GetConfiguration()
			return f.Error() == nil && len(f.Configuration().Servers) == n
		})
	}
	return c
}

func (c *raftCluster) shutdown() {
	for _, x := range c.nodes {
		if err := x.node.Shutdown(); err != nil {
			c.t.Errorf("shutdown %s: %v", x.id, err)
		}
		x.core.Close()
		for _, o := range c.nodes {
			o.trans.Disconnect(x.addr)
		}
	}
}

// leader waits for a node among nodes (default all) whose service leads.
func (c *raftCluster) leader(among ...*raftCP) *raftCP {
	c.t.Helper()
	if len(among) == 0 {
		among = c.nodes
	}
	var found *raftCP
	testkit.WaitFor(c.t, 15*time.Second, "a ready leader", func() bool {
		for _, x := range among {
			if x.dec.Leading() && x.node.IsLeader() {
				found = x
				return true
			}
		}
		return false
	})
	return found
}

func (c *raftCluster) others(x *raftCP) []*raftCP {
	var out []*raftCP
	for _, o := range c.nodes {
		if o != x {
			out = append(out, o)
		}
	}
	return out
}

func (c *raftCluster) isolate(x *raftCP) {
	for _, o := range c.others(x) {
		x.trans.Disconnect(o.addr)
		o.trans.Disconnect(x.addr)
	}
}

func (c *raftCluster) heal() {
	for _, a := range c.nodes {
		for _, b := range c.nodes {
			if a != b {
				a.trans.Connect(b.addr, b.trans)
			}
		}
	}
}

// entries is the node's prefix index as hash -> its holders' URLs: the
// entry set per worker, which every node must agree on (times and LRU
// order are each node's own).
func (x *raftCP) entries() map[uint64]string {
	var entries map[uint64]enginetest.Entry
	x.dec.Do(decider.OpRead, func(eng *engine.Engine) { entries = enginetest.Entries(eng) })
	out := map[uint64]string{}
	for hash, e := range entries {
		var urls []string
		for _, h := range e.Holders {
			urls = append(urls, h.URL)
		}
		out[hash] = strings.Join(urls, ",")
	}
	return out
}

// converged waits until every node has applied the same log and holds the
// same index entries, and fails with the difference otherwise.
func (c *raftCluster) converged() {
	c.t.Helper()
	var sizes []int
	deadline := time.Now().Add(10 * time.Second)
	for {
		applied := c.nodes[0].node.Raft().AppliedIndex()
		same := true
		sizes = sizes[:0]
		first := c.nodes[0].entries()
		for _, x := range c.nodes {
			e := x.entries()
			sizes = append(sizes, len(e))
			same = same && x.node.Raft().AppliedIndex() == applied && maps.Equal(e, first)
		}
		if same {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("indexes differ after the partition healed: entries per node %v", sizes)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func addWorker(ctx context.Context, x *raftCP, url string) error {
	_, err := x.core.Admin().AddWorker(ctx, connect.NewRequest(&cartv1.AddWorkerRequest{Worker: &cartv1.Worker{Url: url}}))
	return err
}

// A write the leader appended but could not commit before it was cut off
// may still commit (had a majority received it), so the answer must be
// "unknown", never the "no leader" of a write it never touched.
func TestWriteOnPartitionedLeaderIsUnknown(t *testing.T) {
	c := newRaftCluster(t, 3)
	ld := c.leader()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := addWorker(ctx, ld, w1); err != nil {
		t.Fatalf("add %s: %v", w1, err)
	}
	c.isolate(ld)
	before := ld.node.Status().LastLogIndex
	err := addWorker(ctx, ld, w2)
	if ld.node.Status().LastLogIndex == before {
		t.Fatalf("the cut-off leader did not append the write (answer %v): too slow to act within one lease", err)
	}
	ce := wantCode(t, err, connect.CodeAborted)
	if ce.Meta().Get(cpclient.HeaderWriteOutcome) != "unknown" || !strings.Contains(ce.Message(), "outcome unknown") {
		t.Fatalf("unknown outcome not marked: %v (meta %v)", ce, ce.Meta())
	}
	// A write it never appended is a definite "no".
	if err := addWorker(ctx, ld, w3); connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "no leader") {
		t.Fatalf("write on the deposed node: %v, want Unavailable no leader", err)
	}
	// The answer tells the client to retry: on the majority's leader, that
	// settles it.
	nl := c.leader(c.others(ld)...)
	if err := addWorker(ctx, nl, w2); err != nil {
		t.Fatalf("retry on the new leader: %v", err)
	}
	c.heal()
	c.converged()
	// raft counts an entry applied when it hands it to the state machine,
	// a moment before the state machine has applied it: poll the state.
	for _, x := range c.nodes {
		testkit.WaitForMsg(t, 5*time.Second, x.id+" has both workers after the heal", func() (bool, string) {
			ws, _ := x.st.Workers()
			return len(ws) == 2, fmt.Sprint(ws)
		})
	}
}

// A leader cut off from the majority keeps answering Route for up to one
// lease and records those placements in its index ahead of the log. They
// never commit, so once the partition heals every node must hold the same
// index entries: the deposed leader withdraws what it never committed.
func TestDeposedLeaderWithdrawsUncommittedPlacements(t *testing.T) {
	c := newRaftCluster(t, 3)
	ld := c.leader()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, w := range []string{w1, w2, w3} {
		if err := addWorker(ctx, ld, w); err != nil {
			t.Fatalf("add %s: %v", w, err)
		}
	}
	routeOn := func(x *raftCP, seed int) (*cartv1.RouteResponse, error) {
		resp, err := x.core.Router().Route(ctx, connect.NewRequest(&cartv1.RouteRequest{Model: "m", Text: text(64, seed), DataplaneId: "dp1"}))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}
	var committed []*cartv1.RouteResponse
	for i := range 20 {
		r, err := routeOn(ld, i)
		if err != nil {
			t.Fatalf("route %d: %v", i, err)
		}
		committed = append(committed, r)
	}
	// An undelivered request's withdrawal must be undone as well when it
	// does not commit: the others still hold that placement.
	testkit.WaitFor(t, 5*time.Second, "first placements replicated", func() bool { return len(c.nodes[2].entries()) > 0 })
	c.converged()

	c.isolate(ld)
	routed := 0
	for i := 100; i < 200; i++ {
		if _, err := routeOn(ld, i); err != nil {
			break // stepped down
		}
		routed++
	}
	if _, err := ld.core.Router().Complete(ctx, connect.NewRequest(&cartv1.CompleteRequest{DataplaneId: "dp1",
		Completions: []*cartv1.Completion{{Ticket: committed[0].GetTicket(), Worker: committed[0].GetWorker()}}})); err != nil {
		t.Logf("complete on the cut-off leader: %v", err)
	}
	if routed == 0 {
		t.Fatal("the cut-off leader routed nothing: too slow to act within one lease")
	}
	nl := c.leader(c.others(ld)...)
	for i := 200; i < 220; i++ {
		if _, err := routeOn(nl, i); err != nil {
			t.Fatalf("route on the new leader: %v", err)
		}
	}
	c.heal()
	c.converged()
	t.Logf("cut-off leader routed %d requests; %d entries on every node after heal", routed, len(nl.entries()))
}
