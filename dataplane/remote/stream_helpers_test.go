package remote

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/health"
	"github.com/cartrouter/cart/controlplane/raftnode"
	"github.com/cartrouter/cart/controlplane/service"
	"github.com/cartrouter/cart/controlplane/state"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
	"github.com/cartrouter/cart/internal/testkit"
)

// pathCounter counts requests by path in front of a handler.
type pathCounter struct {
	next http.Handler
	mu   sync.Mutex
	n    map[string]int
}

func (p *pathCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	if p.n == nil {
		p.n = map[string]int{}
	}
	p.n[r.URL.Path]++
	p.mu.Unlock()
	p.next.ServeHTTP(w, r)
}

func (p *pathCounter) count(path string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n[path]
}

// serveH2C serves h on 127.0.0.1 over HTTP/1.1 and h2c.
func serveH2C(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	srv := testkit.H2CServer(h)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// oneNodeCP is a real single-node control plane (service over Raft) with
// workers wA and wB, served over h2c on 127.0.0.1.
type oneNodeCP struct {
	url   string
	core  *service.Core
	dec   *decider.Decider
	paths *pathCounter
	srv   *httptest.Server
}

func newOneNodeCP(t testing.TB, auth service.AuthOptions) *oneNodeCP {
	t.Helper()
	return newOneNodeCPAt(t, auth, nil)
}

// newOneNodeCPAt is newOneNodeCP reached, and advertised (leader_url), at
// the URL front returns for its server's address: a proxy in front of it.
// front nil: the server's own URL.
func newOneNodeCPAt(t testing.TB, auth service.AuthOptions, front func(addr string) string) *oneNodeCP {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	_, trans := raft.NewInmemTransport("")
	dec := decider.New(decider.Options{Policy: engine.Policy{Threshold: 0.3, BalanceAbsThreshold: 4, BalanceRelThreshold: 1.5, BlockChars: 64},
		MaxEntries: 1 << 16, Rand: rand.New(rand.NewPCG(1, 2)), LoadLease: 5 * time.Second})
	st := state.New(dec)
	x := &oneNodeCP{dec: dec, paths: &pathCounter{}}
	x.srv = testkit.H2CServer(x.paths)
	x.url = "http://" + x.srv.Listener.Addr().String()
	if front != nil {
		x.url = front(x.srv.Listener.Addr().String())
	}
	x.core = service.New(service.Options{
		NodeID: "n1", APIURL: x.url, BlockChars: 64, PlacementBatch: 10 * time.Millisecond, PlacementMax: 512,
		Health:       health.Config{Endpoint: "/health", Interval: time.Hour, Timeout: time.Second, FailureThreshold: 1, SuccessThreshold: 1},
		HealthClient: &http.Client{Transport: okProbes{}}, Logger: log,
	}, dec, st)
	x.paths.next = service.BodyReadDeadline(x.core.Handler(auth), time.Minute)
	x.srv.Start()
	timeouts := raftnode.Timeouts{Heartbeat: 100 * time.Millisecond, Election: 100 * time.Millisecond, LeaderLease: 100 * time.Millisecond, Commit: 5 * time.Millisecond}
	nd, err := raftnode.Start(raftnode.Config{NodeID: "n1", Bootstrap: true, Transport: trans, Timeouts: &timeouts, Logger: log,
		Fatal: func(err error) { t.Errorf("fatal: %v", err) }}, st, x.core.OnLeadership)
	if err != nil {
		t.Fatal(err)
	}
	x.core.SetNode(nd)
	t.Cleanup(func() {
		if err := nd.Shutdown(); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		x.core.Close()
		x.srv.Close()
	})
	testkit.WaitFor(t, 10*time.Second, "leader", nd.IsLeader)
	for _, w := range []string{wA, wB} {
		if _, err := x.core.Admin().AddWorker(context.Background(), connect.NewRequest(&cartv1.AddWorkerRequest{Worker: &cartv1.Worker{Url: w}})); err != nil {
			t.Fatal(err)
		}
	}
	return x
}

// streamLive waits until r's Route stream to target is live.
func streamLive(t testing.TB, r *Router, target string) {
	t.Helper()
	testkit.WaitFor(t, 10*time.Second, "route stream live to "+target, func() bool { return r.streams.live(target) != nil })
}

// streamFallbacks reads cart_route_stream_fallbacks_total{call}.
func streamFallbacks(t testing.TB, r *Router, call string) float64 {
	t.Helper()
	var m dto.Metric
	if err := r.streams.fallbacks.WithLabelValues(call).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// gaugeValue reads a gauge collector.
func gaugeValue(t testing.TB, g prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

// streamCP is a fake leader that serves Stream: routes answer with the
// request id as the worker (so a mismatched answer shows), after hold
// returns; it records the most calls it had unanswered at once.
type streamCP struct {
	*fakeCP
	hold    func(*cartv1.StreamRequest) // nil: answer at once
	inFly   atomic.Int64
	maxFly  atomic.Int64
	calls   atomic.Int64
	streams atomic.Int64
	kill    chan struct{} // closed: every open stream ends with an error
	// electing: streams are refused as by a node with no leader yet.
	electing atomic.Bool

	// batches: this leader reads StreamRequest.more and says so in the
	// hello's answer; without it, it serves only each message's first
	// call, as a leader that predates the field would.
	batches bool
	// answerTogether: to a data plane whose hello declared batches, the
	// calls of one message are answered together in one message, followed
	// by extra (feed frames).
	answerTogether bool
	extra          []*cartv1.StreamResponse
	// feedAck: the hello's answer acknowledges a placement feed request;
	// helloExtra rides in its more.
	feedAck    bool
	helloExtra []*cartv1.StreamResponse
	// settlesRiders: the hello's answer says this leader settles
	// completions riding with Route calls.
	settlesRiders bool
	// msgs counts the messages that carried calls, batched those with
	// more; answerMsgs the answer messages with more.
	msgs, batched, answerMsgs atomic.Int64
}

func newStreamCP(t testing.TB) (*streamCP, *pathCounter) {
	t.Helper()
	f := &streamCP{fakeCP: &fakeCP{}, kill: make(chan struct{})}
	_, h := cartv1connect.NewRouterServiceHandler(f)
	pc := &pathCounter{next: h}
	srv := serveH2C(t, pc)
	f.srv, f.url = srv, srv.URL
	return f, pc
}

// answer serves one call.
func (f *streamCP) answer(m *cartv1.StreamRequest) *cartv1.StreamResponse {
	if f.hold != nil {
		f.hold(m)
	}
	resp := &cartv1.StreamResponse{Id: m.GetId()}
	switch c := m.GetCall().(type) {
	case *cartv1.StreamRequest_Route:
		f.mu.Lock()
		f.routes = append(f.routes, proto.Clone(c.Route).(*cartv1.RouteRequest))
		err := f.routeErr
		f.mu.Unlock()
		if err != nil {
			resp.Result = &cartv1.StreamResponse_Error{Error: &cartv1.StreamError{Code: uint32(connect.CodeOf(err)), Message: err.Error()}}
			break
		}
		resp.Result = &cartv1.StreamResponse_Route{Route: &cartv1.RouteResponse{Worker: c.Route.GetRequestId(), Reason: "cache_miss", FromLeader: true, Ticket: m.GetId()}}
	case *cartv1.StreamRequest_Sync:
		resp.Result = &cartv1.StreamResponse_Sync{Sync: &cartv1.SyncResponse{Workers: []*cartv1.Worker{{Url: wA, Healthy: true}}, WorkersVersion: 1}}
	case *cartv1.StreamRequest_Complete:
		f.mu.Lock()
		f.completes = append(f.completes, proto.Clone(c.Complete).(*cartv1.CompleteRequest))
		f.mu.Unlock()
		resp.Result = &cartv1.StreamResponse_Complete{Complete: &cartv1.CompleteResponse{}}
	}
	return resp
}

func (f *streamCP) Stream(ctx context.Context, st *connect.BidiStream[cartv1.StreamRequest, cartv1.StreamResponse]) error {
	if f.electing.Load() {
		return connect.NewError(connect.CodeUnavailable, errors.New("no leader: election in progress"))
	}
	select {
	case <-f.kill:
		return connect.NewError(connect.CodeUnavailable, context.Canceled)
	default:
	}
	f.streams.Add(1)
	var sendMu sync.Mutex
	ended := false // the handler returned: the stream must not be written
	var wg sync.WaitGroup
	defer func() {
		sendMu.Lock()
		ended = true
		sendMu.Unlock()
		wg.Wait()
	}()
	send := func(resp *cartv1.StreamResponse) {
		select {
		case <-f.kill:
			return // the stream fails: no answer
		default:
		}
		sendMu.Lock()
		if !ended {
			_ = st.Send(resp)
		}
		sendMu.Unlock()
	}
	errc := make(chan error, 1)
	go func() {
		dpBatches := false
		for {
			m, err := st.Receive()
			if err != nil {
				errc <- err
				return
			}
			if m.GetId() == 0 {
				dpBatches = m.GetBatches()
				hello := &cartv1.StreamResponse{Batches: f.batches, More: f.helloExtra, SettlesRiders: f.settlesRiders}
				if f.feedAck && m.GetPlacementFeed() != nil {
					hello.Result = &cartv1.StreamResponse_Placements{Placements: &cartv1.RecentPlacements{}}
				}
				sendMu.Lock()
				if !ended {
					_ = st.Send(hello)
				}
				sendMu.Unlock()
				continue
			}
			f.msgs.Add(1)
			calls := []*cartv1.StreamRequest{m}
			if len(m.GetMore()) > 0 {
				f.batched.Add(1)
				if f.batches {
					calls = append(calls, m.GetMore()...)
				}
			}
			m.More = nil
			n := f.inFly.Add(int64(len(calls)))
			f.calls.Add(int64(len(calls)))
			for old := f.maxFly.Load(); n > old && !f.maxFly.CompareAndSwap(old, n); old = f.maxFly.Load() {
			}
			sendMu.Lock()
			if ended {
				sendMu.Unlock()
				return
			}
			together := f.answerTogether && dpBatches
			if together {
				wg.Add(1)
			} else {
				wg.Add(len(calls))
			}
			sendMu.Unlock()
			if together {
				go func() {
					defer wg.Done()
					var all []*cartv1.StreamResponse
					for _, c := range calls {
						all = append(all, f.answer(c))
					}
					f.inFly.Add(-int64(len(calls)))
					first := all[0]
					first.More = append(all[1:], f.extra...)
					if len(first.More) > 0 {
						f.answerMsgs.Add(1)
					}
					send(first)
				}()
				continue
			}
			for _, c := range calls {
				go func() {
					defer wg.Done()
					resp := f.answer(c)
					f.inFly.Add(-1)
					send(resp)
				}()
			}
		}
	}()
	select {
	case err := <-errc:
		_ = err
		return nil
	case <-f.kill:
		return connect.NewError(connect.CodeInternal, context.Canceled)
	case <-ctx.Done():
		return nil
	}
}

// msgCounter counts the Route stream's messages and the calls and answers
// they carry, on the data plane's side, through an interceptor.
type msgCounter struct {
	calls, msgs, answers, answerMsgs atomic.Int64
}

func (c *msgCounter) interceptors() []connect.Interceptor {
	return []connect.Interceptor{wrapStreamClient(func(sc connect.StreamingClientConn) connect.StreamingClientConn {
		return countingConn{StreamingClientConn: sc, c: c}
	})}
}

func (c *msgCounter) reset() {
	c.calls.Store(0)
	c.msgs.Store(0)
	c.answers.Store(0)
	c.answerMsgs.Store(0)
}

func (c *msgCounter) counts() (calls, msgs, answers, answerMsgs int64) {
	return c.calls.Load(), c.msgs.Load(), c.answers.Load(), c.answerMsgs.Load()
}

// wrapStreamClient is an interceptor that wraps the data plane's
// streaming client conns in wrap, and leaves everything else alone.
type wrapStreamClient func(connect.StreamingClientConn) connect.StreamingClientConn

func (w wrapStreamClient) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc { return next }

func (w wrapStreamClient) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

func (w wrapStreamClient) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, s connect.Spec) connect.StreamingClientConn { return w(next(ctx, s)) }
}

type countingConn struct {
	connect.StreamingClientConn
	c *msgCounter
}

func (cc countingConn) Send(m any) error {
	if r, ok := m.(*cartv1.StreamRequest); ok && r.GetId() != 0 {
		cc.c.msgs.Add(1)
		cc.c.calls.Add(1 + int64(len(r.GetMore())))
	}
	return cc.StreamingClientConn.Send(m)
}

func (cc countingConn) Receive(m any) error {
	err := cc.StreamingClientConn.Receive(m)
	if r, ok := m.(*cartv1.StreamResponse); ok && err == nil {
		cc.c.answerMsgs.Add(1)
		cc.c.answers.Add(1 + int64(len(r.GetMore())))
	}
	return err
}
