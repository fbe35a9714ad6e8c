package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/health"
	"github.com/cartrouter/cart/controlplane/index"
	"github.com/cartrouter/cart/controlplane/raftnode"
	"github.com/cartrouter/cart/controlplane/state"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
	"github.com/cartrouter/cart/internal/testkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const testBlockChars = 16

var testPolicy = engine.Policy{
	Threshold:           0.5,
	BalanceAbsThreshold: 100, // affinity wins unless a holder is far busier
	BalanceRelThreshold: 1.5,
	BlockChars:          testBlockChars,
}

// fakeNode stands in for raftnode.Node: it applies every command at once
// to the local state machine, as a single-node cluster would, and records
// what it was asked to apply.
type fakeNode struct {
	id string
	st *state.State

	applyMu sync.Mutex // serialises applies, like the Raft log
	index   uint64

	mu       sync.Mutex
	leader   bool
	leaderID string
	applyErr error
	cmds     []*cartv1.RaftCommand
	members  []raftnode.Member
}

func newFakeNode(id string, st *state.State) *fakeNode {
	return &fakeNode{id: id, st: st, leader: true, leaderID: id,
		members: []raftnode.Member{{ID: id, Addr: "127.0.0.1:7000", Suffrage: "voter"}}}
}

func (n *fakeNode) Apply(ctx context.Context, cmd *cartv1.RaftCommand) (state.Result, error) {
	if err := ctx.Err(); err != nil {
		return state.Result{}, err
	}
	n.mu.Lock()
	err := n.applyErr
	n.mu.Unlock()
	if err != nil {
		return state.Result{}, err
	}
	data, err := state.Encode(cmd)
	if err != nil {
		return state.Result{}, err
	}
	n.applyMu.Lock()
	defer n.applyMu.Unlock()
	n.index++
	res, err := n.st.Apply(n.index, data)
	if err != nil {
		return state.Result{}, err
	}
	n.mu.Lock()
	n.cmds = append(n.cmds, proto.Clone(cmd).(*cartv1.RaftCommand))
	n.mu.Unlock()
	return res, nil
}

func (n *fakeNode) IsLeader() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.leader
}

func (n *fakeNode) Leader() (string, string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.leaderID == "" {
		return "", ""
	}
	return n.leaderID, "raft-" + n.leaderID
}

func (n *fakeNode) AddVoter(_ context.Context, id, addr string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.leader {
		return raftnode.ErrNotLeader
	}
	n.members = append(n.members, raftnode.Member{ID: id, Addr: addr, Suffrage: "voter"})
	return nil
}

func (n *fakeNode) RemoveServer(_ context.Context, id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.leader {
		return raftnode.ErrNotLeader
	}
	n.members = slices.DeleteFunc(n.members, func(m raftnode.Member) bool { return m.ID == id })
	return nil
}

func (n *fakeNode) TransferLeadership(_ context.Context, id string) (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if id == "" {
		id = "n2"
	}
	n.leader, n.leaderID = false, id
	return id, nil
}

func (n *fakeNode) Status() raftnode.Status {
	n.applyMu.Lock()
	idx := n.index
	n.applyMu.Unlock()
	n.mu.Lock()
	defer n.mu.Unlock()
	st := "follower"
	if n.leader {
		st = "leader"
	}
	return raftnode.Status{
		NodeID: n.id, State: st, LeaderID: n.leaderID, LeaderAddr: "raft-" + n.leaderID,
		Term: 7, CommitIndex: idx, AppliedIndex: idx, LastLogIndex: idx,
		Members: slices.Clone(n.members),
	}
}

func (n *fakeNode) setLeader(leader bool, id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.leader, n.leaderID = leader, id
}

func (n *fakeNode) setApplyErr(err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.applyErr = err
}

func (n *fakeNode) commands() []*cartv1.RaftCommand {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.cmds)
}

// placeBatches and unplaceBatches return the batch commands applied so far.
// placementsOf lists the placements that batches carry, in order.
func placementsOf[B interface{ GetPlacements() []*cartv1.Placement }](batches []B) []*cartv1.Placement {
	var out []*cartv1.Placement
	for _, b := range batches {
		out = append(out, b.GetPlacements()...)
	}
	return out
}

// placesOn is whether one of ps places exactly hs on worker.
func placesOn(ps []*cartv1.Placement, worker string, hs []uint64) bool {
	return slices.ContainsFunc(ps, func(p *cartv1.Placement) bool {
		return p.GetWorker() == worker && slices.Equal(p.GetBlockHashes(), hs)
	})
}

func (n *fakeNode) placeBatches() []*cartv1.PlaceBatchCommand {
	var out []*cartv1.PlaceBatchCommand
	for _, c := range n.commands() {
		if b := c.GetPlaceBatch(); b != nil {
			out = append(out, b)
		}
	}
	return out
}

// unplaceBatches returns the withdrawals replicated so far: those carried
// by place batches, and legacy UnplaceBatch entries.
func (n *fakeNode) unplaceBatches() []*cartv1.UnplaceBatchCommand {
	var out []*cartv1.UnplaceBatchCommand
	for _, c := range n.commands() {
		if b := c.GetUnplaceBatch(); b != nil {
			out = append(out, b)
		}
		if w := c.GetPlaceBatch().GetWithdrawals(); len(w) > 0 {
			out = append(out, &cartv1.UnplaceBatchCommand{Placements: w})
		}
	}
	return out
}

// okTransport answers every health probe with 200.
type okTransport struct{}

func (okTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader("ok")), Header: http.Header{}, Request: r}, nil
}

// testCP is one control-plane node under test.
type testCP struct {
	core   *Core
	node   *fakeNode
	st     *state.State
	dec    *decider.Decider
	srv    *httptest.Server
	url    string
	client *http.Client
}

type cpConfig struct {
	id     string
	leader bool
	auth   AuthOptions
	opts   func(*Options)
	dec    func(*decider.Options)
}

func newTestCP(t testing.TB, cfg cpConfig) *testCP {
	t.Helper()
	if cfg.id == "" {
		cfg.id = "n1"
	}
	do := decider.Options{Policy: testPolicy, MaxEntries: 1 << 20, Rand: rand.New(rand.NewPCG(1, 2)), LoadLease: time.Minute}
	if cfg.dec != nil {
		cfg.dec(&do)
	}
	dec := decider.New(do)
	st := state.New(dec)
	cp := &testCP{st: st, dec: dec}
	var handler http.Handler
	srv := testkit.H2CServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handler.ServeHTTP(w, r) }))
	cp.url = "http://" + srv.Listener.Addr().String()
	cp.client = testkit.H2CClient()
	fwd := testkit.H2CClient()
	o := Options{
		NodeID:         cfg.id,
		APIURL:         cp.url,
		BlockChars:     testBlockChars,
		PlacementBatch: 20 * time.Millisecond,
		PlacementMax:   512,
		Health:         health.Config{Endpoint: "/health", Interval: 50 * time.Millisecond, Timeout: time.Second, FailureThreshold: 1, SuccessThreshold: 1},
		HealthClient:   &http.Client{Transport: okTransport{}},
		Logger:         slog.New(slog.NewTextHandler(io.Discard, nil)),
		ForwardClient:  fwd,
	}
	if cfg.opts != nil {
		cfg.opts(&o)
	}
	cp.core = New(o, dec, st)
	cp.node = newFakeNode(cfg.id, st)
	cp.core.SetNode(cp.node)
	handler = cp.core.Handler(cfg.auth)
	srv.Start()
	cp.srv = srv
	t.Cleanup(func() {
		srv.Close()
		cp.core.Close()
		cp.client.CloseIdleConnections()
		fwd.CloseIdleConnections()
	})
	if cfg.leader {
		cp.core.OnLeadership(true)
		testkit.WaitFor(t, 5*time.Second, "leader publishes its API URL", func() bool { return st.Members()[cfg.id] == cp.url })
	} else {
		cp.node.setLeader(false, "")
	}
	return cp
}

func (cp *testCP) addWorkers(t testing.TB, urls ...string) {
	t.Helper()
	for _, u := range urls {
		cmd := &cartv1.RaftCommand{Body: &cartv1.RaftCommand_UpsertWorker{UpsertWorker: &cartv1.UpsertWorkerCommand{Worker: &cartv1.WorkerSpec{Url: u}}}}
		if _, err := cp.node.Apply(context.Background(), cmd); err != nil {
			t.Fatalf("add worker %s: %v", u, err)
		}
	}
}

// leaderWith is a leader routing to workers, and a data plane's client of
// it: the setup most routing tests start from.
func leaderWith(t testing.TB, workers ...string) (*testCP, cartv1connect.RouterServiceClient) {
	t.Helper()
	cp := newTestCP(t, cpConfig{leader: true})
	cp.addWorkers(t, workers...)
	return cp, cp.router()
}

func (cp *testCP) setMember(t testing.TB, id, url string) {
	t.Helper()
	cmd := &cartv1.RaftCommand{Body: &cartv1.RaftCommand_SetMember{SetMember: &cartv1.SetMemberCommand{NodeId: id, ApiUrl: url}}}
	if _, err := cp.node.Apply(context.Background(), cmd); err != nil {
		t.Fatalf("set member: %v", err)
	}
}

// router returns a RouterService client; with no options it speaks gRPC,
// as data planes do.
func (cp *testCP) router(opts ...connect.ClientOption) cartv1connect.RouterServiceClient {
	if len(opts) == 0 {
		opts = []connect.ClientOption{connect.WithGRPC()}
	}
	return cartv1connect.NewRouterServiceClient(cp.client, cp.url, opts...)
}

func (cp *testCP) admin(opts ...connect.ClientOption) cartv1connect.AdminServiceClient {
	if len(opts) == 0 {
		opts = []connect.ClientOption{connect.WithGRPC()}
	}
	return cartv1connect.NewAdminServiceClient(cp.client, cp.url, opts...)
}

// loads returns the leader's per-worker load as ListWorkers reports it.
func (cp *testCP) loads(t testing.TB) map[string]uint32 {
	t.Helper()
	resp, err := cp.admin().ListWorkers(context.Background(), connect.NewRequest(&cartv1.ListWorkersRequest{}))
	if err != nil {
		t.Fatalf("ListWorkers: %v", err)
	}
	out := map[string]uint32{}
	for _, w := range resp.Msg.GetWorkers() {
		out[w.GetUrl()] = w.GetLoad()
	}
	return out
}

// inBackground calls fn every interval, on a goroutine of its own, until
// the test ends: data planes that keep syncing while the test looks on.
func inBackground(t testing.TB, interval time.Duration, fn func(context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			fn(ctx)
			select {
			case <-ctx.Done():
			case <-time.After(interval):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

func route(t testing.TB, c cartv1connect.RouterServiceClient, req *cartv1.RouteRequest) *cartv1.RouteResponse {
	t.Helper()
	resp, err := c.Route(context.Background(), connect.NewRequest(req))
	if err != nil {
		t.Fatalf("Route(%v): %v", req, err)
	}
	return resp.Msg
}

// liveRoute routes txt for model "m" from data plane "dp1", taking load.
func liveRoute(t testing.TB, c cartv1connect.RouterServiceClient, txt string) *cartv1.RouteResponse {
	t.Helper()
	return route(t, c, &cartv1.RouteRequest{Model: "m", Text: txt, DataplaneId: "dp1"})
}

// settle completes decision d for data plane "dp1" and returns how many
// decisions that settled.
func settle(t testing.TB, c cartv1connect.RouterServiceClient, d *cartv1.RouteResponse, delivered bool) uint32 {
	t.Helper()
	return complete(t, c, "dp1", &cartv1.Completion{Ticket: d.GetTicket(), Worker: d.GetWorker(), Delivered: delivered})
}

func complete(t testing.TB, c cartv1connect.RouterServiceClient, dp string, comps ...*cartv1.Completion) uint32 {
	t.Helper()
	resp, err := c.Complete(context.Background(), connect.NewRequest(&cartv1.CompleteRequest{DataplaneId: dp, Completions: comps}))
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	return resp.Msg.GetSettled()
}

func syncLoads(t testing.TB, c cartv1connect.RouterServiceClient, dp string, loads map[string]uint32) *cartv1.SyncResponse {
	t.Helper()
	req := &cartv1.SyncRequest{DataplaneId: dp}
	for w, n := range loads {
		req.Loads = append(req.Loads, &cartv1.WorkerLoad{Worker: w, InFlight: n})
	}
	resp, err := c.Sync(context.Background(), connect.NewRequest(req))
	if err != nil {
		t.Fatalf("Sync: %v", err)
	}
	return resp.Msg
}

func wantCode(t testing.TB, err error, code connect.Code) *connect.Error {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %v", code)
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		t.Fatalf("error %v is not a connect error", err)
	}
	if ce.Code() != code {
		t.Fatalf("got code %v (%v), want %v", ce.Code(), err, code)
	}
	return ce
}

// wantCodeOrNil is wantCode where code 0 (a table's "allowed") wants no
// error at all.
func wantCodeOrNil(t testing.TB, err error, code connect.Code) {
	t.Helper()
	if code != 0 {
		wantCode(t, err, code)
	} else if err != nil {
		t.Fatalf("want no error, got %v", err)
	}
}

// text returns n deterministic characters; texts of different seeds differ
// in their first block, so they share no prefix.
func text(n int, seed int) string {
	b := []byte(fmt.Sprintf("seed-%08d:", seed))
	for i := len(b); i < n; i++ {
		b = append(b, byte('a'+(i*3+i/testBlockChars*11)%26))
	}
	return string(b[:n])
}

func hashes(model, s string) []uint64 {
	return index.Hash(nil, model, []byte(s), testBlockChars)
}
