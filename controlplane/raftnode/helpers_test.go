package raftnode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"go.uber.org/goleak"

	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/engine/enginetest"
	"github.com/cartrouter/cart/controlplane/index"
	"github.com/cartrouter/cart/controlplane/state"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var testPolicy = engine.Policy{BlockChars: 64, Threshold: 0.3, BalanceAbsThreshold: 64, BalanceRelThreshold: 1.5}

// fastTimeouts make elections take tens of milliseconds. raft's own tests
// use 50 ms throughout; a lease that short makes leaders step down whenever
// a loaded 2-core machine deschedules the process for a moment, so the
// lease and heartbeat get a little more room. Tests still retry writes on
// leadership changes, since a loaded machine can stall for longer.
var fastTimeouts = Timeouts{Heartbeat: 100 * time.Millisecond, Election: 100 * time.Millisecond, LeaderLease: 100 * time.Millisecond, Commit: 5 * time.Millisecond}

// replica is the state side of one node: the decider and the replicated
// state, as the control plane wires them.
type replica struct {
	dec *decider.Decider
	st  *state.State
}

func newReplica() *replica {
	dec := decider.New(decider.Options{Policy: testPolicy, MaxEntries: 1 << 20, Rand: rand.New(rand.NewPCG(1, 2))})
	return &replica{dec: dec, st: state.New(dec)}
}

// callbackLog keeps what a callback reports from Raft's goroutines, for the
// test to read.
type callbackLog[T any] struct {
	mu   sync.Mutex
	vals []T
}

func (r *callbackLog[T]) add(v T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.vals = append(r.vals, v)
}

func (r *callbackLog[T]) all() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.vals)
}

// leadership records onLeadership calls.
type leadership = callbackLog[bool]

// fatalRecorder stands in for the process exit.
type fatalRecorder = callbackLog[error]

type testNode struct {
	id    string
	addr  raft.ServerAddress
	trans *raft.InmemTransport
	*replica
	node   *Node
	lead   *leadership
	fatals *fatalRecorder
}

type cluster struct {
	t     *testing.T
	nodes []*testNode
}

type clusterOpts struct {
	snapshotThreshold uint64
	trailingLogs      uint64
}

// testLogger sends warnings and errors to the test log: they show only when
// a test fails or with -v. Connection goroutines of a stopped transport may
// still log for a moment after the test ends, which t.Log forbids, so the
// writer goes quiet at cleanup.
func testLogger(t *testing.T) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.done = true
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

// newCluster starts n in-memory nodes: node 1 bootstraps alone and the
// others join through AddVoter, as in production.
func newCluster(t *testing.T, n int, o clusterOpts) *cluster {
	t.Helper()
	c := &cluster{t: t}
	for i := range n {
		addr, trans := raft.NewInmemTransport("")
		c.nodes = append(c.nodes, &testNode{id: fmt.Sprintf("n%d", i+1), addr: addr, trans: trans, replica: newReplica(), lead: &leadership{}, fatals: &fatalRecorder{}})
	}
	for _, a := range c.nodes {
		for _, b := range c.nodes {
			if a != b {
				a.trans.Connect(b.addr, b.trans)
			}
		}
	}
	log := testLogger(t)
	for i, tn := range c.nodes {
		nd, err := Start(Config{
			NodeID:            tn.id,
			Bootstrap:         i == 0,
			Transport:         tn.trans,
			Timeouts:          &fastTimeouts,
			SnapshotThreshold: o.snapshotThreshold,
			TrailingLogs:      o.trailingLogs,
			Logger:            log,
			Fatal:             tn.fatals.add,
		}, tn.st, tn.lead.add)
		if err != nil {
			t.Fatalf("start %s: %v", tn.id, err)
		}
		tn.node = nd
	}
	t.Cleanup(c.shutdown)
	first := c.nodes[0]
	testkit.WaitFor(t, 5*time.Second, "bootstrap leader", first.node.IsLeader)
	for _, tn := range c.nodes[1:] {
		if err := first.node.AddVoter(context.Background(), tn.id, string(tn.addr)); err != nil {
			t.Fatalf("add voter %s: %v", tn.id, err)
		}
	}
	testkit.WaitFor(t, 5*time.Second, "all nodes see the full configuration", func() bool {
		for _, tn := range c.nodes {
			if len(tn.node.Status().Members) != n {
				return false
			}
		}
		return true
	})
	return c
}

func (c *cluster) shutdown() {
	for _, tn := range c.nodes {
		if err := tn.node.Shutdown(); err != nil {
			c.t.Errorf("shutdown %s: %v", tn.id, err)
		}
		// RPCs to a stopped in-memory transport wait out its timeout;
		// unplugging it makes them fail at once, as a refused TCP dial would.
		for _, o := range c.nodes {
			o.trans.Disconnect(tn.addr)
		}
		if errs := tn.fatals.all(); len(errs) > 0 {
			c.t.Errorf("%s: unexpected Fatal calls: %v", tn.id, errs)
		}
	}
}

// leader waits for a node that reports ready leadership, among nodes.
func (c *cluster) leader(among ...*testNode) *testNode {
	c.t.Helper()
	if len(among) == 0 {
		among = c.nodes
	}
	var found *testNode
	testkit.WaitFor(c.t, 5*time.Second, "a ready leader", func() bool {
		for _, tn := range among {
			if tn.node.IsLeader() {
				found = tn
				return true
			}
		}
		return false
	})
	return found
}

// isolate cuts tn off from every other node, both directions.
func (c *cluster) isolate(tn *testNode) {
	for _, o := range c.nodes {
		if o != tn {
			tn.trans.Disconnect(o.addr)
			o.trans.Disconnect(tn.addr)
		}
	}
}

// heal reconnects every pair.
func (c *cluster) heal() {
	for _, a := range c.nodes {
		for _, b := range c.nodes {
			if a != b {
				a.trans.Connect(b.addr, b.trans)
			}
		}
	}
}

// dump is an order-insensitive picture of a replica's state: worker specs,
// members, and the prefix index with holders named by URL (worker ids are
// local to each engine).
type dump struct {
	workers        string
	workersVersion uint64
	members        map[string]string
	entries        map[uint64]string
}

func (r *replica) dump() dump {
	ws, ver := r.st.Workers()
	var parts []string
	for _, w := range ws {
		parts = append(parts, fmt.Sprintf("%s/%d/%d/%d", w.URL, w.MaxLoad, w.LoadPenalty, w.CacheCapacityTokens))
	}
	d := dump{workers: strings.Join(parts, ","), workersVersion: ver, members: r.st.Members(), entries: map[uint64]string{}}
	var entries map[uint64]enginetest.Entry
	r.dec.Do(decider.OpRead, func(eng *engine.Engine) { entries = enginetest.Entries(eng) })
	for hash, e := range entries {
		d.entries[hash] = fmt.Sprintf("%d:%v", e.Used, e.Holders)
	}
	return d
}

func (d dump) equal(o dump) bool {
	return d.workers == o.workers && d.workersVersion == o.workersVersion &&
		maps.Equal(d.members, o.members) && maps.Equal(d.entries, o.entries)
}

func (d dump) String() string {
	return fmt.Sprintf("workers=[%s] v%d members=%v entries=%d", d.workers, d.workersVersion, d.members, len(d.entries))
}

// converge waits until every node has applied the same log prefix and the
// states agree, and returns the common state.
func (c *cluster) converge(timeout time.Duration) dump {
	c.t.Helper()
	var last []dump
	var applied []uint64
	testkit.WaitForMsg(c.t, timeout, "the nodes to converge", func() (bool, string) {
		last, applied = last[:0], applied[:0]
		for _, tn := range c.nodes {
			applied = append(applied, tn.node.Raft().AppliedIndex())
		}
		for _, a := range applied[1:] {
			if a != applied[0] {
				return false, fmt.Sprintf("applied %v, states %v", applied, last)
			}
		}
		for _, tn := range c.nodes {
			last = append(last, tn.dump())
		}
		for _, d := range last[1:] {
			if !d.equal(last[0]) {
				return false, fmt.Sprintf("applied %v, states %v", applied, last)
			}
		}
		return true, ""
	})
	return last[0]
}

// Command builders.

func upsertCmd(url string, maxLoad uint32) *cartv1.RaftCommand {
	return &cartv1.RaftCommand{Body: &cartv1.RaftCommand_UpsertWorker{UpsertWorker: &cartv1.UpsertWorkerCommand{
		Worker: &cartv1.WorkerSpec{Url: url, MaxLoad: maxLoad, CacheCapacityTokens: 1 << 20},
	}}}
}

func removeCmd(url string) *cartv1.RaftCommand {
	return &cartv1.RaftCommand{Body: &cartv1.RaftCommand_RemoveWorker{RemoveWorker: &cartv1.RemoveWorkerCommand{Url: url}}}
}

func memberCmd(id, apiURL string) *cartv1.RaftCommand {
	return &cartv1.RaftCommand{Body: &cartv1.RaftCommand_SetMember{SetMember: &cartv1.SetMemberCommand{NodeId: id, ApiUrl: apiURL}}}
}

func placeCmd(ps ...*cartv1.Placement) *cartv1.RaftCommand {
	return &cartv1.RaftCommand{Body: &cartv1.RaftCommand_PlaceBatch{PlaceBatch: &cartv1.PlaceBatchCommand{Placements: ps}}}
}

func unplaceCmd(ps ...*cartv1.Placement) *cartv1.RaftCommand {
	return &cartv1.RaftCommand{Body: &cartv1.RaftCommand_UnplaceBatch{UnplaceBatch: &cartv1.UnplaceBatchCommand{Placements: ps}}}
}

// prompt is a request text and its block hashes under testPolicy.
type prompt struct {
	text   []byte
	hashes []uint64
}

func newPrompt(r *rand.Rand, blocks int) prompt {
	text := make([]byte, blocks*testPolicy.BlockChars)
	for i := range text {
		text[i] = 'a' + byte(r.IntN(26))
	}
	return prompt{text: text, hashes: index.Hash(nil, "model", text, testPolicy.BlockChars)}
}

func placement(worker string, p prompt, at int64) *cartv1.Placement {
	return &cartv1.Placement{Worker: worker, BlockHashes: p.hashes, AtUnixNanos: at}
}

// apply applies cmd on whichever node leads, retrying across leadership
// changes (commands are idempotent), and returns the result and the node
// that applied it.
func (c *cluster) apply(cmd *cartv1.RaftCommand, among ...*testNode) (state.Result, *testNode) {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ld := c.leader(among...)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		res, err := ld.node.Apply(ctx, cmd)
		cancel()
		if err == nil {
			return res, ld
		}
		if !errors.Is(err, ErrNotLeader) && !errors.Is(err, context.DeadlineExceeded) {
			c.t.Fatalf("apply on %s: %v", ld.id, err)
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("apply: no leader could commit within 10s: %v", err)
		}
	}
}

// alternating checks onLeadership calls: gains and losses alternate,
// starting with a gain.
func alternating(ev []bool) bool {
	for i, v := range ev {
		if v != (i%2 == 0) {
			return false
		}
	}
	return true
}

// route asks tn's engine, dry run, where p would go.
func (r *replica) route(p prompt) (engine.Decision, error) {
	d, err := r.dec.Decide(decider.Request{Request: engine.Request{Hashes: p.hashes, KeyLen: len(p.text), DryRun: true}})
	return d.Decision, err
}
