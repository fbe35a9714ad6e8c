package service

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/cartrouter/cart/controlplane/decider"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
	"github.com/cartrouter/cart/internal/testkit"
)

// openStream opens a Stream on cp and checks the hello.
func openStream(t *testing.T, cp *testCP) *connect.BidiStreamForClient[cartv1.StreamRequest, cartv1.StreamResponse] {
	t.Helper()
	return openStreamWith(t, cp, &cartv1.StreamRequest{})
}

// openStreamWith opens a Stream on cp with hello and checks its answer,
// which says the leader reads batched calls.
func openStreamWith(t *testing.T, cp *testCP, hello *cartv1.StreamRequest) *connect.BidiStreamForClient[cartv1.StreamRequest, cartv1.StreamResponse] {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	st := cp.router().Stream(ctx)
	t.Cleanup(func() {
		cancel()
		_ = st.CloseRequest()
		_ = st.CloseResponse()
	})
	if err := st.Send(hello); err != nil {
		t.Fatal(err)
	}
	m, err := st.Receive()
	if err != nil || m.GetId() != 0 || m.GetResult() != nil || !m.GetBatches() || !m.GetSettlesRiders() || len(m.GetMore()) != 0 {
		t.Fatalf("hello answered %v, %v", m, err)
	}
	return st
}

// receiveAnswers reads messages until n answers came, unpacking more, and
// returns the answers by id and how many messages carried them.
func receiveAnswers(t *testing.T, st *connect.BidiStreamForClient[cartv1.StreamRequest, cartv1.StreamResponse], n int) (map[uint64]*cartv1.StreamResponse, int) {
	t.Helper()
	got, sizes := receiveSized(t, st, n)
	return got, len(sizes)
}

// receiveSized is receiveAnswers, with the encoded size of each message.
func receiveSized(t *testing.T, st *connect.BidiStreamForClient[cartv1.StreamRequest, cartv1.StreamResponse], n int) (map[uint64]*cartv1.StreamResponse, []int) {
	t.Helper()
	// Closing the request side ends a Receive that would wait forever for
	// a missing answer (cancelling the stream's context alone does not).
	// Nothing sends meanwhile.
	stop := time.AfterFunc(30*time.Second, func() { _ = st.CloseRequest() })
	defer stop.Stop()
	got := map[uint64]*cartv1.StreamResponse{}
	var sizes []int
	for len(got) < n {
		m, err := st.Receive()
		if err != nil {
			t.Fatalf("after %d of %d answers: %v", len(got), n, err)
		}
		sizes = append(sizes, proto.Size(m))
		more := m.GetMore()
		m.More = nil
		for _, a := range append([]*cartv1.StreamResponse{m}, more...) {
			if len(a.GetMore()) != 0 {
				t.Fatalf("answer %d nests more", a.GetId())
			}
			if _, dup := got[a.GetId()]; dup {
				t.Fatalf("answer %d twice", a.GetId())
			}
			got[a.GetId()] = a
		}
	}
	return got, sizes
}

func routeCall(id uint64, seed int) *cartv1.StreamRequest {
	return &cartv1.StreamRequest{Id: id, TimeoutMicros: 5e6, Call: &cartv1.StreamRequest_Route{Route: &cartv1.RouteRequest{Model: "m", Text: text(100, seed), DataplaneId: "dp1", DryRun: true}}}
}

// Calls batched in one message are each served and answered under their
// own id; batched elements that are not plain calls (a hello, nested
// more, hello-only fields, no call) are answered INVALID_ARGUMENT.
func TestStreamBatchedCalls(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true})
	cp.addWorkers(t, w1, w2)
	st := openStreamWith(t, cp, &cartv1.StreamRequest{Batches: true})
	first := routeCall(1, 1)
	first.More = []*cartv1.StreamRequest{
		{Id: 2, Call: &cartv1.StreamRequest_Complete{Complete: &cartv1.CompleteRequest{DataplaneId: "dp1"}}},
		{Id: 3, Call: &cartv1.StreamRequest_Sync{Sync: &cartv1.SyncRequest{DataplaneId: "dp1"}}},
		routeCall(4, 2),
		{}, // a hello
		{Id: 5, Call: &cartv1.StreamRequest_Sync{Sync: &cartv1.SyncRequest{}}, More: []*cartv1.StreamRequest{routeCall(6, 3)}},
		{Id: 7, Call: &cartv1.StreamRequest_Sync{Sync: &cartv1.SyncRequest{}}, PlacementFeed: &cartv1.PlacementFeed{}},
		{Id: 8},
		{Id: 9, Call: &cartv1.StreamRequest_Sync{Sync: &cartv1.SyncRequest{}}, Batches: true},
	}
	if err := st.Send(first); err != nil {
		t.Fatal(err)
	}
	got, _ := receiveAnswers(t, st, 9)
	for _, id := range []uint64{1, 4} {
		if w := got[id].GetRoute().GetWorker(); w != w1 && w != w2 {
			t.Fatalf("route %d answered %v", id, got[id])
		}
	}
	if got[2].GetComplete() == nil || len(got[3].GetSync().GetWorkers()) != 2 {
		t.Fatalf("complete answered %v, sync %v", got[2], got[3])
	}
	for _, id := range []uint64{0, 5, 7, 8, 9} {
		if connect.Code(got[id].GetError().GetCode()) != connect.CodeInvalidArgument {
			t.Fatalf("invalid batched call %d answered %v, want invalid_argument", id, got[id])
		}
	}
	if _, ok := got[6]; ok {
		t.Fatalf("a call nested in a batched call was served: %v", got[6])
	}
	// The stream still serves calls afterwards.
	if err := st.Send(routeCall(10, 4)); err != nil {
		t.Fatal(err)
	}
	if got, _ := receiveAnswers(t, st, 1); got[10].GetRoute() == nil {
		t.Fatalf("call after the batch answered %v", got)
	}
}

// holdFirstAnswer makes the next message cp's streams send wait until n
// answers queued behind it, so that the test knows they are ready
// together.
func holdFirstAnswer(t *testing.T, cp *testCP, n int) *atomic.Bool {
	var armed atomic.Bool
	cp.core.streams.flushHook = func(queued func() int) {
		if armed.CompareAndSwap(true, false) {
			if ok, _ := testkit.Poll(10*time.Second, func() (bool, string) { return queued() >= n, "" }); !ok {
				t.Errorf("%d answers queued, want %d", queued(), n)
			}
		}
	}
	return &armed
}

// heldRouteBatch sends n route calls in one message on a new stream of cp
// whose hello declares batches, with the first answer held until the
// other n-1 are queued behind it; it checks that each call was routed and
// returns the encoded size of each message the answers came in.
func heldRouteBatch(t *testing.T, cp *testCP, batches bool, n int) []int {
	t.Helper()
	armed := holdFirstAnswer(t, cp, n-1)
	st := openStreamWith(t, cp, &cartv1.StreamRequest{Batches: batches})
	armed.Store(true)
	first := routeCall(1, 0)
	for i := 2; i <= n; i++ {
		first.More = append(first.More, routeCall(uint64(i), i))
	}
	if err := st.Send(first); err != nil {
		t.Fatal(err)
	}
	got, sizes := receiveSized(t, st, n)
	for id := uint64(1); id <= uint64(n); id++ {
		if got[id].GetRoute().GetWorker() == "" {
			t.Fatalf("call %d answered %v", id, got[id])
		}
	}
	return sizes
}

// Answers ready together share a message to a data plane whose hello says
// it reads batches, and never to one whose hello does not (a data plane
// that predates StreamResponse.more would lose them).
func TestStreamBatchesAnswers(t *testing.T) {
	const n = 20
	for _, batches := range []bool{true, false} {
		t.Run(fmt.Sprintf("batches=%v", batches), func(t *testing.T) {
			cp := newTestCP(t, cpConfig{leader: true})
			cp.addWorkers(t, w1, w2)
			msgs := len(heldRouteBatch(t, cp, batches, n))
			want := n
			if batches {
				want = 2 // the held answer, then the n-1 queued behind it
			}
			if msgs != want {
				t.Fatalf("%d answers in %d messages, want %d", n, msgs, want)
			}
			// The stream counters saw the same: the hello and one message
			// of n calls in; the hello's answer and the answers' messages
			// out.
			for _, c := range []struct {
				dir         string
				msgs, items float64
			}{{"received", 2, n + 1}, {"sent", float64(want + 1), n + 1}} {
				if m, i := cp.streamCounters(c.dir); m != c.msgs || i != c.items {
					t.Errorf("%s: %v messages carrying %v items, want %v carrying %v", c.dir, m, i, c.msgs, c.items)
				}
			}
		})
	}
}

// streamCounters reads cart_cp_stream_messages_total and
// cart_cp_stream_items_total for direction.
func (cp *testCP) streamCounters(direction string) (messages, items float64) {
	var m, i dto.Metric
	if err := cp.core.metrics.streamMessages.WithLabelValues(direction).Write(&m); err != nil {
		panic(err)
	}
	if err := cp.core.metrics.streamItems.WithLabelValues(direction).Write(&i); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue(), i.GetCounter().GetValue()
}

// Answers ready together that would exceed the byte cap of a message are
// split over several messages, each within it.
func TestStreamAnswerBatchBytes(t *testing.T) {
	const n, limit = 20, 1000 // route answers are ~100-200 bytes
	cp := newTestCP(t, cpConfig{leader: true})
	cp.addWorkers(t, w1, w2)
	cp.core.streams.batchBytes = limit
	sizes := heldRouteBatch(t, cp, true, n)
	total := 0
	for _, sz := range sizes {
		total += sz
		if sz > limit {
			t.Fatalf("messages of %v bytes, want each within %d", sizes, limit)
		}
	}
	// Without the cap the n-1 queued answers would share one message:
	// they must not fit in one, or the test proves nothing.
	if total-sizes[0] <= limit || len(sizes) < 3 {
		t.Fatalf("messages of %v bytes: the queued answers should need several", sizes)
	}
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

// A stream Route decided after its timeout_micros is answered
// DEADLINE_EXCEEDED and undone: no load, no ticket. The service's clock
// moves a second on every reading, so the decision always ends past a
// one-second timeout.
func TestStreamRoutePastItsTimeoutIsUndone(t *testing.T) {
	base := time.Unix(1_000_000, 0)
	var ticks atomic.Int64
	cp := newTestCP(t, cpConfig{leader: true, opts: func(o *Options) {
		o.Now = func() time.Time { return base.Add(time.Duration(ticks.Add(1)) * time.Second) }
	}})
	cp.addWorkers(t, w1, w2)
	st := openStream(t, cp)
	if err := st.Send(&cartv1.StreamRequest{Id: 1, TimeoutMicros: 1e6, Call: &cartv1.StreamRequest_Route{Route: &cartv1.RouteRequest{Model: "m", Text: text(100, 1), DataplaneId: "dp1"}}}); err != nil {
		t.Fatal(err)
	}
	r, err := st.Receive()
	if err != nil || r.GetId() != 1 {
		t.Fatalf("answer %v, %v", r, err)
	}
	if connect.Code(r.GetError().GetCode()) != connect.CodeDeadlineExceeded {
		t.Fatalf("route past its timeout answered %v, want deadline_exceeded", r)
	}
	for _, w := range cp.dec.Workers() {
		if w.Load != 0 {
			t.Errorf("worker %s has load %d after an undone decision", w.URL, w.Load)
		}
	}
	if n := cp.dec.Dropped(decider.DropAbandoned); n != 1 {
		t.Errorf("%d abandoned decisions, want 1", n)
	}
}
