package service

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"
	dto "github.com/prometheus/client_model/go"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
	"github.com/cartrouter/cart/internal/testkit"
)

// openStream opens a Stream on cp and checks the hello.
func openStream(t *testing.T, cp *testCP) *connect.BidiStreamForClient[cartv1.StreamRequest, cartv1.StreamResponse] {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	st := cp.router().Stream(ctx)
	t.Cleanup(func() {
		cancel()
		_ = st.CloseRequest()
		_ = st.CloseResponse()
	})
	if err := st.Send(&cartv1.StreamRequest{}); err != nil {
		t.Fatal(err)
	}
	m, err := st.Receive()
	if err != nil || m.GetId() != 0 || m.GetResult() != nil {
		t.Fatalf("hello answered %v, %v", m, err)
	}
	return st
}

// The stream serves the leader's Route, Complete and Sync, each answer
// naming its call, and errors as the unary calls' codes.
func TestStreamCalls(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true})
	cp.addWorkers(t, w1, w2)
	st := openStream(t, cp)
	var open dto.Metric
	if err := cp.core.metrics.streams.Write(&open); err != nil || open.GetGauge().GetValue() != 1 {
		t.Fatalf("cart_cp_route_streams_open = %v (%v) with one stream open", open.GetGauge().GetValue(), err)
	}
	send := func(m *cartv1.StreamRequest) *cartv1.StreamResponse {
		t.Helper()
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
		r, err := st.Receive()
		if err != nil || r.GetId() != m.GetId() {
			t.Fatalf("call %d answered %v, %v", m.GetId(), r, err)
		}
		return r
	}
	r := send(&cartv1.StreamRequest{Id: 7, TimeoutMicros: 1e6, Call: &cartv1.StreamRequest_Route{Route: &cartv1.RouteRequest{Model: "m", Text: text(100, 1), DataplaneId: "dp1"}}})
	rt := r.GetRoute()
	if rt.GetWorker() == "" || rt.GetTicket() == 0 || !rt.GetFromLeader() || rt.GetLeaderUrl() != cp.url {
		t.Fatalf("route answer %v", r)
	}
	c := send(&cartv1.StreamRequest{Id: 8, Call: &cartv1.StreamRequest_Complete{Complete: &cartv1.CompleteRequest{DataplaneId: "dp1",
		Completions: []*cartv1.Completion{{Ticket: rt.GetTicket(), Worker: rt.GetWorker(), Delivered: true, PromptTokens: -1, CachedTokens: -1}}}}})
	if c.GetComplete().GetSettled() != 1 {
		t.Fatalf("complete answer %v", c)
	}
	s := send(&cartv1.StreamRequest{Id: 9, Call: &cartv1.StreamRequest_Sync{Sync: &cartv1.SyncRequest{DataplaneId: "dp1"}}})
	if len(s.GetSync().GetWorkers()) != 2 || s.GetSync().GetLeaderUrl() != cp.url {
		t.Fatalf("sync answer %v", s)
	}
	e := send(&cartv1.StreamRequest{Id: 10, Call: &cartv1.StreamRequest_Route{Route: &cartv1.RouteRequest{Text: "x", ExcludeWorkers: []string{w1, w2}}}})
	if connect.Code(e.GetError().GetCode()) != connect.CodeResourceExhausted {
		t.Fatalf("route with every worker excluded: %v, want resource_exhausted", e)
	}
	e = send(&cartv1.StreamRequest{Id: 11})
	if connect.Code(e.GetError().GetCode()) != connect.CodeInvalidArgument {
		t.Fatalf("empty call: %v, want invalid_argument", e)
	}
}

// A follower refuses the stream with the leader's URL in a NotLeader
// detail; a leader that steps down, or shuts down, ends its streams.
func TestStreamLeadership(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true})
	st := openStream(t, cp)
	cp.setMember(t, "n2", "http://n2.test:6701")
	cp.node.setLeader(false, "n2")
	cp.core.OnLeadership(false)
	if _, err := st.Receive(); connect.CodeOf(err) != connect.CodeUnavailable || leaderOf(err) != "http://n2.test:6701" {
		t.Fatalf("stream after step-down: %v (leader %q), want unavailable naming n2", err, leaderOf(err))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fs := cp.router().Stream(ctx)
	_ = fs.Send(&cartv1.StreamRequest{})
	if _, err := fs.Receive(); connect.CodeOf(err) != connect.CodeUnavailable || leaderOf(err) != "http://n2.test:6701" {
		t.Fatalf("stream on a follower: %v, want unavailable naming n2", err)
	}
	_ = fs.CloseRequest()
	_ = fs.CloseResponse()

	cp.node.setLeader(true, "n1")
	cp.core.OnLeadership(true)
	st = openStream(t, cp)
	cp.core.CloseStreams()
	if _, err := st.Receive(); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("stream after CloseStreams: %v, want unavailable", err)
	}
}

// The stream is authenticated like every RouterService call.
func TestStreamNeedsClusterToken(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true, auth: AuthOptions{Token: "tok"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := cp.router().Stream(ctx)
	_ = st.Send(&cartv1.StreamRequest{})
	if _, err := st.Receive(); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("stream without a token: %v", err)
	}
	_ = st.CloseRequest()
	_ = st.CloseResponse()
}

func leaderOf(err error) string {
	ce := new(connect.Error)
	if !errors.As(err, &ce) {
		return ""
	}
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			if nl, ok := v.(*cartv1.NotLeader); ok {
				return nl.GetLeaderUrl()
			}
		}
	}
	return ""
}

// The API body read deadline does not cut off a stream that outlives it:
// its body lasts as long as its data plane.
func TestStreamOutlivesBodyReadDeadline(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true})
	cp.addWorkers(t, w1)
	srv := testkit.H2CServer(BodyReadDeadline(cp.core.Handler(AuthOptions{}), 20*time.Millisecond))
	srv.Start()
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := cartv1connect.NewRouterServiceClient(cp.client, srv.URL, connect.WithGRPC()).Stream(ctx)
	defer func() { _ = st.CloseRequest(); _ = st.CloseResponse() }()
	if err := st.Send(&cartv1.StreamRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Receive(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // five deadlines: the condition under test, not a verdict
	if err := st.Send(&cartv1.StreamRequest{Id: 1, Call: &cartv1.StreamRequest_Route{Route: &cartv1.RouteRequest{Text: "x", DryRun: true}}}); err != nil {
		t.Fatal(err)
	}
	if m, err := st.Receive(); err != nil || m.GetRoute().GetWorker() != w1 {
		t.Fatalf("route after the body deadline: %v, %v", m, err)
	}
}
