package service

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/cartrouter/cart/controlplane/cpclient"
	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/raftnode"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
)

func TestAdminWorkers(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true})
	ac := cp.admin()
	ctx := context.Background()
	add := func(w *cartv1.Worker) (*cartv1.Worker, error) {
		resp, err := ac.AddWorker(ctx, connect.NewRequest(&cartv1.AddWorkerRequest{Worker: w}))
		if err != nil {
			return nil, err
		}
		return resp.Msg.GetWorker(), nil
	}

	for _, bad := range []string{"", "ftp://w.test", "http://", "http://u:p@w.test", "http://w.test:99999", "http://w.test/?q=1"} {
		_, err := add(&cartv1.Worker{Url: bad})
		wantCode(t, err, connect.CodeInvalidArgument)
	}
	_, err := add(nil)
	wantCode(t, err, connect.CodeInvalidArgument)

	got, err := add(&cartv1.Worker{Url: "http://w9.test:8000/", MaxLoad: 4, LoadPenalty: 1, CacheCapacityTokens: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetUrl() != "http://w9.test:8000" || got.GetMaxLoad() != 4 || got.GetLoadPenalty() != 1 || got.GetCacheCapacityTokens() != 1000 || !got.GetHealthy() {
		t.Fatalf("AddWorker = %v", got)
	}
	before := len(cp.node.commands())
	again, err := add(&cartv1.Worker{Url: "http://w9.test:8000", MaxLoad: 4, LoadPenalty: 1, CacheCapacityTokens: 1000})
	if err != nil {
		t.Fatalf("identical re-add: %v", err)
	}
	if again.GetUrl() != got.GetUrl() {
		t.Fatalf("identical re-add = %v", again)
	}
	if len(cp.node.commands()) != before {
		t.Fatal("identical re-add went through Raft")
	}
	_, err = add(&cartv1.Worker{Url: "http://w9.test:8000", MaxLoad: 5})
	wantCode(t, err, connect.CodeAlreadyExists)

	_, err = ac.UpdateWorker(ctx, connect.NewRequest(&cartv1.UpdateWorkerRequest{Worker: &cartv1.Worker{Url: "http://nope.test"}}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = ac.UpdateWorker(ctx, connect.NewRequest(&cartv1.UpdateWorkerRequest{Worker: &cartv1.Worker{Url: "nope"}}))
	wantCode(t, err, connect.CodeInvalidArgument)
	up, err := ac.UpdateWorker(ctx, connect.NewRequest(&cartv1.UpdateWorkerRequest{Worker: &cartv1.Worker{Url: "http://w9.test:8000", MaxLoad: 7}}))
	if err != nil {
		t.Fatal(err)
	}
	if up.Msg.GetWorker().GetMaxLoad() != 7 || up.Msg.GetWorker().GetLoadPenalty() != 0 {
		t.Fatalf("UpdateWorker = %v", up.Msg.GetWorker())
	}

	list, err := ac.ListWorkers(ctx, connect.NewRequest(&cartv1.ListWorkersRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Msg.GetWorkers()) != 1 || list.Msg.GetWorkers()[0].GetMaxLoad() != 7 || list.Msg.GetWorkersVersion() < 2 {
		t.Fatalf("ListWorkers = %v", list.Msg)
	}

	_, err = ac.RemoveWorker(ctx, connect.NewRequest(&cartv1.RemoveWorkerRequest{Url: "http://nope.test"}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = ac.RemoveWorker(ctx, connect.NewRequest(&cartv1.RemoveWorkerRequest{Url: "::"}))
	wantCode(t, err, connect.CodeInvalidArgument)
	if _, err := ac.RemoveWorker(ctx, connect.NewRequest(&cartv1.RemoveWorkerRequest{Url: "http://w9.test:8000/"})); err != nil {
		t.Fatalf("RemoveWorker: %v", err)
	}
	if l := cp.loads(t); len(l) != 0 {
		t.Fatalf("workers after remove: %v", l)
	}
}

func TestAdminNotLeader(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true})
	cp.setMember(t, "n2", "http://n2.test:7070")
	ctx := context.Background()
	ac := cp.admin()

	// Leadership lost between the check and the commit: Raft says not
	// leader and names n2.
	cp.node.setLeader(true, "n2")
	cp.node.setApplyErr(fmt.Errorf("%w: leadership lost; the leader is n2", raftnode.ErrNotLeader))
	_, err := ac.AddWorker(ctx, connect.NewRequest(&cartv1.AddWorkerRequest{Worker: &cartv1.Worker{Url: w1}}))
	ce := wantCode(t, err, connect.CodeFailedPrecondition)
	if got := ce.Meta().Get(cpclient.HeaderLeaderURL); got != "http://n2.test:7070" {
		t.Fatalf("%s = %q (meta %v)", cpclient.HeaderLeaderURL, got, ce.Meta())
	}
	if !strings.Contains(ce.Message(), "n2") {
		t.Fatalf("not-leader message = %q", ce.Message())
	}
	// The same over the Connect protocol.
	_, err = cp.admin(connect.WithClientOptions()).AddWorker(ctx, connect.NewRequest(&cartv1.AddWorkerRequest{Worker: &cartv1.Worker{Url: w1}}))
	ce = wantCode(t, err, connect.CodeFailedPrecondition)
	if got := ce.Meta().Get(cpclient.HeaderLeaderURL); got != "http://n2.test:7070" {
		t.Fatalf("connect protocol: %s = %q", cpclient.HeaderLeaderURL, got)
	}

	// No leader known: Unavailable.
	cp.node.setLeader(true, "")
	_, err = ac.AddWorker(ctx, connect.NewRequest(&cartv1.AddWorkerRequest{Worker: &cartv1.Worker{Url: w1}}))
	wantCode(t, err, connect.CodeUnavailable)

	// Any other commit failure: Unavailable, not a success.
	cp.node.setLeader(true, "n1")
	cp.node.setApplyErr(errors.New("disk on fire"))
	_, err = ac.AddWorker(ctx, connect.NewRequest(&cartv1.AddWorkerRequest{Worker: &cartv1.Worker{Url: w1}}))
	wantCode(t, err, connect.CodeUnavailable)
}

func TestClusterStatus(t *testing.T) {
	cp, rc := leaderWith(t, w1, w2)
	liveRoute(t, rc, text(64, 30))
	syncLoads(t, rc, "dp2", nil)
	ac := cp.admin()
	if _, err := ac.AddVoter(context.Background(), connect.NewRequest(&cartv1.AddVoterRequest{Id: "n2", RaftAddress: "127.0.0.1:7001", ApiUrl: "http://n2.test:7070"})); err != nil {
		t.Fatal(err)
	}
	resp, err := ac.ClusterStatus(context.Background(), connect.NewRequest(&cartv1.ClusterStatusRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	st := resp.Msg
	if st.GetNodeId() != "n1" || st.GetState() != "leader" || st.GetLeaderId() != "n1" || st.GetLeaderUrl() != cp.url || st.GetTerm() != 7 {
		t.Fatalf("ClusterStatus identity = %v", st)
	}
	if st.GetCommitIndex() == 0 || st.GetAppliedIndex() != st.GetCommitIndex() || st.GetLastLogIndex() < st.GetCommitIndex() {
		t.Fatalf("ClusterStatus indexes = %v", st)
	}
	if st.GetWorkers() != 2 || st.GetHealthyWorkers() != 2 || st.GetIndexEntries() != 4 || st.GetDataplanes() != 2 {
		t.Fatalf("ClusterStatus counts = %v", st)
	}
	if len(st.GetMembers()) != 2 {
		t.Fatalf("members = %v", st.GetMembers())
	}
	for _, m := range st.GetMembers() {
		switch m.GetId() {
		case "n1":
			if !m.GetLeader() || m.GetApiUrl() != cp.url || m.GetSuffrage() != "voter" {
				t.Fatalf("member n1 = %v", m)
			}
		case "n2":
			if m.GetLeader() || m.GetApiUrl() != "http://n2.test:7070" || m.GetRaftAddress() != "127.0.0.1:7001" {
				t.Fatalf("member n2 = %v", m)
			}
		default:
			t.Fatalf("unexpected member %v", m)
		}
	}
}

func TestAdminMembership(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true})
	ac := cp.admin()
	ctx := context.Background()
	_, err := ac.AddVoter(ctx, connect.NewRequest(&cartv1.AddVoterRequest{Id: "n2"}))
	wantCode(t, err, connect.CodeInvalidArgument)
	if _, err := ac.AddVoter(ctx, connect.NewRequest(&cartv1.AddVoterRequest{Id: "n2", RaftAddress: "127.0.0.1:7001", ApiUrl: "http://n2.test"})); err != nil {
		t.Fatal(err)
	}
	if cp.st.Members()["n2"] != "http://n2.test" {
		t.Fatalf("members = %v", cp.st.Members())
	}
	_, err = ac.RemoveServer(ctx, connect.NewRequest(&cartv1.RemoveServerRequest{Id: "n9"}))
	wantCode(t, err, connect.CodeNotFound)
	if _, err := ac.RemoveServer(ctx, connect.NewRequest(&cartv1.RemoveServerRequest{Id: "n2"})); err != nil {
		t.Fatal(err)
	}
	if _, ok := cp.st.Members()["n2"]; ok {
		t.Fatalf("n2 still in the directory: %v", cp.st.Members())
	}
	resp, err := ac.TransferLeadership(ctx, connect.NewRequest(&cartv1.TransferLeadershipRequest{Id: "n3"}))
	if err != nil || resp.Msg.GetLeaderId() != "n3" {
		t.Fatalf("TransferLeadership = %v, %v", resp, err)
	}
}

// A node whose index is full before a pass makes room says so, in
// ClusterStatus (cartctl cluster status) and in its metrics.
func TestClusterStatusReportsAFullIndex(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true, dec: func(o *decider.Options) { o.MaxEntries, o.Headroom = 8, 1 }})
	cp.addWorkers(t, w1, w2)
	rc := cp.router()
	for i := range 4 {
		liveRoute(t, rc, text(64, 100+i)) // 4 blocks each: 16 new blocks for a ceiling of 9
	}
	cp.dec.Maintain() // no Run loop here: the pass evicts down to 8
	resp, err := cp.admin().ClusterStatus(context.Background(), connect.NewRequest(&cartv1.ClusterStatusRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	st := resp.Msg
	if st.GetIndexSkippedInserts() == 0 || st.GetIndexEvictions() == 0 || st.GetIndexEntries() != 8 {
		t.Fatalf("ClusterStatus index: %d entries, %d evicted, %d skipped", st.GetIndexEntries(), st.GetIndexEvictions(), st.GetIndexSkippedInserts())
	}
	for name, want := range map[string]uint64{"cart_cp_index_skipped_inserts_total": st.GetIndexSkippedInserts(), "cart_cp_index_evictions_total": st.GetIndexEvictions()} {
		v, found, err := testkit.MetricSample(cp.client, cp.url+"/metrics", name)
		if err != nil || !found || uint64(v) != want {
			t.Errorf("%s = %v (found %v, err %v), ClusterStatus says %d", name, v, found, err, want)
		}
	}
}
