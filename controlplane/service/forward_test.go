package service

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"
	dto "github.com/prometheus/client_model/go"

	"github.com/cartrouter/cart/controlplane/cpclient"
	"github.com/cartrouter/cart/controlplane/raftnode"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
)

// pair is a leader "n2" and a follower "n1" that knows n2's API URL.
func newPair(t *testing.T, leaderAuth, followerAuth AuthOptions, followerToken string) (leader, follower *testCP) {
	t.Helper()
	leader = newTestCP(t, cpConfig{id: "n2", leader: true, auth: leaderAuth})
	leader.addWorkers(t, w1, w2)
	follower = newTestCP(t, cpConfig{id: "n1", auth: followerAuth, opts: func(o *Options) { o.Token = followerToken }})
	follower.setMember(t, "n2", leader.url)
	follower.node.setLeader(false, "n2")
	return leader, follower
}

func TestFollowerForwards(t *testing.T) {
	leader, follower := newPair(t, AuthOptions{}, AuthOptions{}, "")
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			rc := follower.router(p.opts...)
			txt := text(64, 20)
			d := liveRoute(t, rc, txt)
			if !d.GetFromLeader() || d.GetLeaderId() != "n2" || d.GetTicket() == 0 || d.GetWorker() == "" {
				t.Fatalf("forwarded Route = %v", d)
			}
			if got := leader.loads(t)[d.GetWorker()]; got != 1 {
				t.Fatalf("leader load after forwarded Route = %d, want 1", got)
			}
			if again := route(t, rc, &cartv1.RouteRequest{Model: "m", Text: txt, DryRun: true}); again.GetReason() != "cache_hit" {
				t.Fatalf("forwarded repeat = %v, want cache_hit", again)
			}
			if n := settle(t, rc, d, true); n != 1 {
				t.Fatalf("forwarded Complete settled %d", n)
			}
			if got := leader.loads(t)[d.GetWorker()]; got != 0 {
				t.Fatalf("leader load after forwarded Complete = %d", got)
			}
			s := syncLoads(t, rc, "dp1", map[string]uint32{w1: 2})
			if s.GetLeaderId() != "n2" || s.GetLeaderUrl() != leader.url || len(s.GetWorkers()) < 2 {
				t.Fatalf("forwarded Sync = %v", s)
			}
			if got := leader.loads(t)[w1]; got != 2 {
				t.Fatalf("leader load after forwarded Sync = %d, want 2", got)
			}
			syncLoads(t, rc, "dp1", nil)
		})
	}

	ac := follower.admin()
	ctx := context.Background()
	const w9 = "http://w9.test:8000"
	if _, err := ac.AddWorker(ctx, connect.NewRequest(&cartv1.AddWorkerRequest{Worker: &cartv1.Worker{Url: w9, MaxLoad: 4}})); err != nil {
		t.Fatalf("forwarded AddWorker: %v", err)
	}
	if _, ok := leader.loads(t)[w9]; !ok {
		t.Fatal("forwarded AddWorker did not reach the leader")
	}
	list, err := ac.ListWorkers(ctx, connect.NewRequest(&cartv1.ListWorkersRequest{}))
	if err != nil || len(list.Msg.GetWorkers()) != 3 {
		t.Fatalf("forwarded ListWorkers = %v, %v", list, err)
	}
	if _, err := ac.UpdateWorker(ctx, connect.NewRequest(&cartv1.UpdateWorkerRequest{Worker: &cartv1.Worker{Url: w9, MaxLoad: 8}})); err != nil {
		t.Fatalf("forwarded UpdateWorker: %v", err)
	}
	if _, err := ac.RemoveWorker(ctx, connect.NewRequest(&cartv1.RemoveWorkerRequest{Url: w9})); err != nil {
		t.Fatalf("forwarded RemoveWorker: %v", err)
	}
	if _, ok := leader.loads(t)[w9]; ok {
		t.Fatal("forwarded RemoveWorker did not reach the leader")
	}
	_, err = ac.RemoveWorker(ctx, connect.NewRequest(&cartv1.RemoveWorkerRequest{Url: w9}))
	wantCode(t, err, connect.CodeNotFound) // the leader's answer comes back as is
}

func TestForwardedCallToFollowerDoesNotLoop(t *testing.T) {
	_, follower := newPair(t, AuthOptions{}, AuthOptions{}, "")
	ctx := context.Background()
	rc := follower.router()
	forwarded := func(req interface{ Header() http.Header }) {
		req.Header().Set(cpclient.HeaderForwarded, "1")
	}
	rreq := connect.NewRequest(&cartv1.RouteRequest{Text: "x"})
	forwarded(rreq)
	_, err := rc.Route(ctx, rreq)
	ce := wantCode(t, err, connect.CodeUnavailable)
	if !strings.Contains(ce.Message(), "not the leader either") {
		t.Fatalf("loop refusal message = %q", ce.Message())
	}
	creq := connect.NewRequest(&cartv1.CompleteRequest{})
	forwarded(creq)
	_, err = rc.Complete(ctx, creq)
	wantCode(t, err, connect.CodeUnavailable)
	sreq := connect.NewRequest(&cartv1.SyncRequest{})
	forwarded(sreq)
	_, err = rc.Sync(ctx, sreq)
	wantCode(t, err, connect.CodeUnavailable)
	areq := connect.NewRequest(&cartv1.AddWorkerRequest{Worker: &cartv1.Worker{Url: w3}})
	forwarded(areq)
	_, err = follower.admin().AddWorker(ctx, areq)
	wantCode(t, err, connect.CodeUnavailable)
}

func TestFollowerWithoutLeader(t *testing.T) {
	_, follower := newPair(t, AuthOptions{}, AuthOptions{}, "")
	follower.node.setLeader(false, "")
	ctx := context.Background()
	rc, ac := follower.router(), follower.admin()
	calls := map[string]func() error{
		"Route":    func() error { _, err := rc.Route(ctx, connect.NewRequest(&cartv1.RouteRequest{Text: "x"})); return err },
		"Complete": func() error { _, err := rc.Complete(ctx, connect.NewRequest(&cartv1.CompleteRequest{})); return err },
		"Sync":     func() error { _, err := rc.Sync(ctx, connect.NewRequest(&cartv1.SyncRequest{})); return err },
		"AddWorker": func() error {
			_, err := ac.AddWorker(ctx, connect.NewRequest(&cartv1.AddWorkerRequest{Worker: &cartv1.Worker{Url: w3}}))
			return err
		},
		"RemoveWorker": func() error {
			_, err := ac.RemoveWorker(ctx, connect.NewRequest(&cartv1.RemoveWorkerRequest{Url: w3}))
			return err
		},
		"AddVoter": func() error {
			_, err := ac.AddVoter(ctx, connect.NewRequest(&cartv1.AddVoterRequest{Id: "n3", RaftAddress: "x:1"}))
			return err
		},
	}
	for name, call := range calls {
		ce := wantCode(t, call(), connect.CodeUnavailable)
		if !strings.Contains(ce.Message(), "no leader") {
			t.Fatalf("%s without leader: %q", name, ce.Message())
		}
	}
	// An operator still sees the replicated worker set.
	if _, err := ac.ListWorkers(ctx, connect.NewRequest(&cartv1.ListWorkersRequest{})); err != nil {
		t.Fatalf("ListWorkers without leader: %v", err)
	}

	// A leader that has not published its URL yet.
	follower.node.setLeader(false, "n3")
	_, err := rc.Route(ctx, connect.NewRequest(&cartv1.RouteRequest{Text: "x"}))
	ce := wantCode(t, err, connect.CodeUnavailable)
	if !strings.Contains(ce.Message(), "n3") {
		t.Fatalf("unpublished leader message = %q", ce.Message())
	}
}

func TestForwardCarriesToken(t *testing.T) {
	auth := AuthOptions{Token: "s3cret"}
	bearer := connect.WithInterceptors(cpclient.Bearer("s3cret"))
	t.Run("with token", func(t *testing.T) {
		_, follower := newPair(t, auth, auth, "s3cret")
		rc := follower.router(connect.WithGRPC(), bearer)
		if d := route(t, rc, &cartv1.RouteRequest{Text: "x", DataplaneId: "dp1"}); !d.GetFromLeader() {
			t.Fatalf("forwarded Route = %v", d)
		}
	})
	t.Run("without token", func(t *testing.T) {
		_, follower := newPair(t, auth, auth, "")
		rc := follower.router(connect.WithGRPC(), bearer)
		_, err := rc.Route(context.Background(), connect.NewRequest(&cartv1.RouteRequest{Text: "x"}))
		wantCode(t, err, connect.CodeUnauthenticated)
	})
}

// notLeaderDetail returns the NotLeader detail of err, failing the test
// when it has none.
func notLeaderDetail(t *testing.T, err error) *cartv1.NotLeader {
	t.Helper()
	nl, ok := cpclient.NotLeaderOf(err)
	if !ok {
		t.Fatalf("error %v has no NotLeader detail from the server", err)
	}
	return nl
}

// "Not leader" travels as a structured detail naming what the node knows
// of the leader, so clients never parse the message.
func TestNotLeaderDetail(t *testing.T) {
	leader, follower := newPair(t, AuthOptions{}, AuthOptions{}, "")
	ctx := context.Background()
	route := func(forwarded bool) error {
		req := connect.NewRequest(&cartv1.RouteRequest{Text: "x"})
		if forwarded {
			req.Header().Set(cpclient.HeaderForwarded, "1")
		}
		_, err := follower.router().Route(ctx, req)
		return err
	}
	// A forwarding loop: the node names the leader it believes in.
	err := route(true)
	wantCode(t, err, connect.CodeUnavailable)
	if nl := notLeaderDetail(t, err); nl.GetLeaderId() != "n2" || nl.GetLeaderUrl() != leader.url {
		t.Fatalf("loop: detail %v", nl)
	}
	// The leader has not published its URL.
	follower.node.setLeader(false, "n3")
	err = route(false)
	if nl := notLeaderDetail(t, err); nl.GetLeaderId() != "n3" || nl.GetLeaderUrl() != "" {
		t.Fatalf("unpublished: detail %v", nl)
	}
	// No leader at all, on a read and on a write.
	follower.node.setLeader(false, "")
	if nl := notLeaderDetail(t, route(false)); nl.GetLeaderId() != "" || nl.GetLeaderUrl() != "" {
		t.Fatalf("no leader: detail %v", nl)
	}
	_, err = follower.admin().AddWorker(ctx, connect.NewRequest(&cartv1.AddWorkerRequest{Worker: &cartv1.Worker{Url: w3}}))
	wantCode(t, err, connect.CodeUnavailable)
	notLeaderDetail(t, err)

	// A write refused by a node that lost leadership names the new one,
	// and so does an unknown outcome; both over the Connect protocol too.
	leader.setMember(t, "n1", follower.url)
	leader.node.setLeader(true, "n1")
	for _, opts := range [][]connect.ClientOption{nil, {connect.WithClientOptions()}} {
		leader.node.setApplyErr(fmt.Errorf("%w: leadership lost", raftnode.ErrNotLeader))
		_, err = leader.admin(opts...).AddWorker(ctx, connect.NewRequest(&cartv1.AddWorkerRequest{Worker: &cartv1.Worker{Url: w3}}))
		wantCode(t, err, connect.CodeFailedPrecondition)
		if nl := notLeaderDetail(t, err); nl.GetLeaderId() != "n1" || nl.GetLeaderUrl() != follower.url {
			t.Fatalf("refused write: detail %v", nl)
		}
		leader.node.setApplyErr(errors.Join(raftnode.ErrNotLeader, raftnode.ErrOutcomeUnknown))
		_, err = leader.admin(opts...).AddWorker(ctx, connect.NewRequest(&cartv1.AddWorkerRequest{Worker: &cartv1.Worker{Url: w3}}))
		wantCode(t, err, connect.CodeAborted)
		if nl := notLeaderDetail(t, err); nl.GetLeaderId() != "n1" || nl.GetLeaderUrl() != follower.url {
			t.Fatalf("unknown outcome: detail %v", nl)
		}
	}
}

// A forwarded Route's answer names the leader's URL, so a data plane can
// go there directly; the follower counts what it forwarded.
func TestForwardedRouteNamesLeaderURL(t *testing.T) {
	leader, follower := newPair(t, AuthOptions{}, AuthOptions{}, "")
	d := route(t, follower.router(), &cartv1.RouteRequest{Model: "m", Text: text(64, 3), DataplaneId: "dp1"})
	if d.GetLeaderUrl() != leader.url || d.GetLeaderId() != "n2" {
		t.Fatalf("forwarded Route = %v, want leader_url %s", d, leader.url)
	}
	if d := route(t, leader.router(), &cartv1.RouteRequest{Model: "m", Text: text(64, 4), DataplaneId: "dp1"}); d.GetLeaderUrl() != leader.url {
		t.Fatalf("direct Route = %v", d)
	}
	if got := follower.forwardedRoutes(); got != 1 {
		t.Fatalf("follower forwarded %v Route calls, want 1", got)
	}
	if got := leader.forwardedRoutes(); got != 0 {
		t.Fatalf("leader forwarded %v Route calls", got)
	}
}

// forwardedRoutes reads cart_cp_forwarded_total for Route.
func (cp *testCP) forwardedRoutes() float64 {
	var m dto.Metric
	if err := cp.core.metrics.forwarded.WithLabelValues(cartv1connect.RouterServiceRouteProcedure).Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

type bigSyncLeader struct {
	cartv1connect.UnimplementedRouterServiceHandler
	workers int
}

func (b bigSyncLeader) Sync(context.Context, *connect.Request[cartv1.SyncRequest]) (*connect.Response[cartv1.SyncResponse], error) {
	return connect.NewResponse(&cartv1.SyncResponse{Workers: bigWorkers(b.workers)}), nil
}

// bigWorkers returns n workers of about 64 KiB each.
func bigWorkers(n int) []*cartv1.Worker {
	url := "http://" + strings.Repeat("w", 64<<10)
	ws := make([]*cartv1.Worker, n)
	for i := range ws {
		ws[i] = &cartv1.Worker{Url: url}
	}
	return ws
}

type bigListLeader struct {
	cartv1connect.UnimplementedAdminServiceHandler
	workers int
}

func (b bigListLeader) ListWorkers(context.Context, *connect.Request[cartv1.ListWorkersRequest]) (*connect.Response[cartv1.ListWorkersResponse], error) {
	return connect.NewResponse(&cartv1.ListWorkersResponse{Workers: bigWorkers(b.workers)}), nil
}

// A follower forwarding a call reads the leader's answer only up to the
// forwarder's bound (cpclient.MaxAnswerBytes in production), for router
// and admin calls alike.
func TestForwardedAnswerOverTheReadLimitIsRefused(t *testing.T) {
	const limit = 1 << 20
	perWorker := 64<<10 + 16
	for _, svc := range []string{"router", "admin"} {
		for _, c := range []struct {
			workers int
			want    connect.Code
		}{
			{limit/perWorker - 1, 0},
			{limit/perWorker + 1, connect.CodeResourceExhausted},
		} {
			mux := http.NewServeMux()
			mux.Handle(cartv1connect.NewRouterServiceHandler(bigSyncLeader{workers: c.workers}))
			mux.Handle(cartv1connect.NewAdminServiceHandler(bigListLeader{workers: c.workers}))
			srv := httptest.NewUnstartedServer(mux)
			srv.EnableHTTP2 = true
			srv.StartTLS()
			f := newForwarder(srv.Client(), "", "", limit)
			var err error
			if svc == "router" {
				_, err = f.routerTo(srv.URL).Sync(context.Background(), connect.NewRequest(&cartv1.SyncRequest{}))
			} else {
				_, err = f.adminTo(srv.URL).ListWorkers(context.Background(), connect.NewRequest(&cartv1.ListWorkersRequest{}))
			}
			srv.Close()
			if c.want == 0 && err != nil {
				t.Errorf("%s, %d workers (under the limit): %v", svc, c.workers, err)
			}
			if c.want != 0 && connect.CodeOf(err) != c.want {
				t.Errorf("%s, %d workers (over the limit): %v, want %v", svc, c.workers, err, c.want)
			}
		}
	}
}
