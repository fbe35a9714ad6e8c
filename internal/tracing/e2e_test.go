package tracing_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/cpclient"
	"github.com/cartrouter/cart/controlplane/daemon"
	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/dataplane/server"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/internal/tracing"
)

// replicaPool is a set of fake inference servers that remember the trace
// headers of every completion request; failFirst makes the very first
// request of the pool answer 503 (whichever replica gets it).
type replicaPool struct {
	failFirst atomic.Bool
	served    atomic.Int64
	mu        sync.Mutex
	seen      []seenRequest
}

type seenRequest struct {
	replica, traceparent, tracestate string
	status                           int
}

func (p *replicaPool) start(t *testing.T) string {
	t.Helper()
	var url string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.WriteHeader(http.StatusOK) // health probes
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		status := http.StatusOK
		if p.served.Add(1) == 1 && p.failFirst.Load() {
			status = http.StatusServiceUnavailable
		}
		p.mu.Lock()
		p.seen = append(p.seen, seenRequest{replica: url, traceparent: r.Header.Get("Traceparent"), tracestate: r.Header.Get("Tracestate"), status: status})
		p.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":5,"completion_tokens":1}}`)
	}))
	t.Cleanup(srv.Close)
	url = srv.URL
	return url
}

func (p *replicaPool) requests() []seenRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]seenRequest(nil), p.seen...)
}

// newTraceparent is a fresh sampled client trace context.
func newTraceparent() (traceID, parent string) {
	var b [24]byte
	_, _ = rand.Read(b[:])
	traceID, span := hex.EncodeToString(b[:16]), hex.EncodeToString(b[16:])
	return traceID, "00-" + traceID + "-" + span + "-01"
}

func post(t *testing.T, base, traceparent string) (int, string) {
	t.Helper()
	body := `{"model":"m","messages":[{"role":"system","content":"You are a tracing test."},{"role":"user","content":"hello"}]}`
	resp, b, _ := testkit.PostJSON(t, base+"/v1/chat/completions", body, "Traceparent", traceparent, "Tracestate", "client=1")
	return resp.StatusCode, b
}

func inTrace(rec *tracetest.SpanRecorder, traceID string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanContext().TraceID().String() == traceID {
			out = append(out, s)
		}
	}
	return out
}

func only(t *testing.T, spans []sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d spans named %s in the trace, want 1 (trace: %v)", len(found), name, names(spans))
	}
	return found[0]
}

func named(spans []sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name()
	}
	return out
}

func childOf(t *testing.T, child, parent sdktrace.ReadOnlySpan) {
	t.Helper()
	if child.Parent().SpanID() != parent.SpanContext().SpanID() || child.SpanContext().TraceID() != parent.SpanContext().TraceID() {
		t.Errorf("span %s (parent %s) is not a child of %s (%s)", child.Name(), child.Parent().SpanID(), parent.Name(), parent.SpanContext().SpanID())
	}
}

// replicaSaw checks the traceparent a replica received names the attempt
// span as its parent.
func replicaSaw(t *testing.T, got seenRequest, attempt sdktrace.ReadOnlySpan) {
	t.Helper()
	want := fmt.Sprintf("00-%s-%s-01", attempt.SpanContext().TraceID(), attempt.SpanContext().SpanID())
	if got.traceparent != want {
		t.Errorf("replica %s got traceparent %q, want %q (the attempt span)", got.replica, got.traceparent, want)
	}
	if got.tracestate != "client=1" {
		t.Errorf("replica %s got tracestate %q, want the client's", got.replica, got.tracestate)
	}
}

func allInOneConfig(t *testing.T, workers ...string) *config.Config {
	t.Helper()
	cfg := config.Default()
	cfg.Server.Host, cfg.Server.MinOpenFiles = "127.0.0.1", 0
	cfg.Health.IntervalSecs = 3600
	cfg.Proxy.InitialBackoffMs, cfg.Proxy.MaxBackoffMs = 1, 5
	cfg.Log.Level = "error"
	for _, w := range workers {
		cfg.Workers = append(cfg.Workers, config.Worker{URL: w})
	}
	cfg.Normalize()
	if err := cfg.Validate(config.RoleAllInOne); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// One request through the all-in-one router, retried once: its spans form
// one tree under the client's span, and each replica attempt carries its
// own span's context.
func TestAllInOneTrace(t *testing.T) {
	pool := &replicaPool{}
	pool.failFirst.Store(true)
	w1, w2 := pool.start(t), pool.start(t)
	rec := tracetest.NewSpanRecorder()
	tr := tracing.NewWithProcessor(rec, tracing.Settings{ServiceName: "cart-all-in-one", Role: "all-in-one", SampleRatio: 1})
	defer func() { _ = tr.Shutdown(context.Background()) }()
	a, err := server.NewAllInOne(allInOneConfig(t, w1, w2), nil, quiet(), 1, server.WithTracer(tr))
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(a.HTTP.Handler)
	defer front.Close()

	traceID, parent := newTraceparent()
	if code, body := post(t, front.URL, parent); code != http.StatusOK {
		t.Fatalf("status %d: %s", code, body)
	}
	// The request span ends once the handler has returned, which may be
	// just after the client read the last byte.
	testkit.WaitFor(t, 5*time.Second, "the request span ends", func() bool { return len(named(inTrace(rec, traceID), tracing.SpanRequest)) == 1 })
	spans := inTrace(rec, traceID)
	req := only(t, spans, tracing.SpanRequest)
	if req.Parent().TraceID().String() != traceID || req.Parent().SpanID().String() != parent[36:52] || !req.Parent().IsRemote() {
		t.Errorf("request span's parent %v is not the client's span", req.Parent())
	}
	wantAttr(t, req, "cart.endpoint", "chat_completions")
	wantAttr(t, req, "cart.tenant", proxy.AnonymousTenant)
	wantAttr(t, req, "cart.model", "m")
	wantAttr(t, req, "http.response.status_code", int64(200))

	routes, ups := named(spans, tracing.SpanRoute), named(spans, tracing.SpanUpstream)
	if len(routes) != 2 || len(ups) != 2 {
		t.Fatalf("%d route and %d upstream spans, want 2 and 2 (one retry): %v", len(routes), len(ups), names(spans))
	}
	seen := pool.requests()
	if len(seen) != 2 || seen[0].status != 503 || seen[1].replica == seen[0].replica {
		t.Fatalf("replicas saw %+v, want a 503 then a 200 from the other replica", seen)
	}
	for i, u := range ups {
		childOf(t, u, req)
		childOf(t, routes[i], req)
		wantAttr(t, u, "cart.attempt", int64(i+1))
		wantAttr(t, u, "cart.worker", seen[i].replica)
		wantAttr(t, u, "http.response.status_code", int64(seen[i].status))
		wantAttr(t, routes[i], "cart.route.worker", seen[i].replica)
		replicaSaw(t, seen[i], u)
	}
	wantAttr(t, routes[0], "cart.route.reason", "cache_miss")
	wantAttr(t, routes[0], "cart.route.from_leader", true)
	wantAttr(t, req, "cart.worker", seen[1].replica)
}

// With tracing off the client's trace context reaches the replica as sent.
func TestAllInOneTracingOffPassesTraceparent(t *testing.T) {
	pool := &replicaPool{}
	w1 := pool.start(t)
	a, err := server.NewAllInOne(allInOneConfig(t, w1), nil, quiet(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if a.Tracer != nil {
		t.Fatal("tracing on without tracing.otlp_endpoint")
	}
	front := httptest.NewServer(a.HTTP.Handler)
	defer front.Close()
	_, parent := newTraceparent()
	if code, body := post(t, front.URL, parent); code != http.StatusOK {
		t.Fatalf("status %d: %s", code, body)
	}
	seen := pool.requests()
	if len(seen) != 1 || seen[0].traceparent != parent || seen[0].tracestate != "client=1" {
		t.Errorf("replica saw %+v, want traceparent %q and tracestate client=1 unchanged", seen, parent)
	}
}

// startControlPlane runs a one-node control plane (real Raft, temp data
// dir) with replica as its worker until ctx ends; done reports Serve's end.
func startControlPlane(ctx context.Context, t *testing.T, replica string, edit func(*config.Config), opts ...server.Option) (url string, done chan error) {
	t.Helper()
	cfg := config.Default()
	cfg.ControlPlane.NodeID, cfg.ControlPlane.DataDir, cfg.ControlPlane.Bootstrap = "n1", t.TempDir(), true
	cfg.ControlPlane.APIAddr, cfg.ControlPlane.RaftAddr = testkit.FreeAddr(t), testkit.FreeAddr(t)
	cfg.Workers = []config.Worker{{URL: replica}}
	cfg.Health.IntervalSecs, cfg.Health.TimeoutSecs = 0.2, 0.2
	cfg.Log.Level = "error"
	edit(cfg)
	cfg.Normalize()
	if err := cfg.Validate(config.RoleControlPlane); err != nil {
		t.Fatal(err)
	}
	cp, err := daemon.Start(ctx, cfg, quiet(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", cfg.ControlPlane.APIAddr)
	if err != nil {
		_ = cp.Node.Shutdown()
		t.Fatal(err)
	}
	done = make(chan error, 1)
	go func() { done <- cp.Serve(ctx, ln) }()
	return "http://" + cfg.ControlPlane.APIAddr, done
}

// One request through a data plane and a real control-plane node (Raft,
// Connect API): the data plane's spans, the node's Route span and the
// replica's traceparent all belong to the client's trace, linked parent to
// child across both hops. The two processes' tracers are separate, so the
// link can only have travelled in headers.
// Over the Route stream (the default), the trace context travels in each
// stream message; over unary calls, in the headers.
func TestDistributedTrace(t *testing.T) {
	t.Run("stream", func(t *testing.T) { distributedTrace(t, true) })
	t.Run("unary", func(t *testing.T) { distributedTrace(t, false) })
}

func distributedTrace(t *testing.T, stream bool) {
	pool := &replicaPool{}
	replica := pool.start(t)
	cpRec, dpRec := tracetest.NewSpanRecorder(), tracetest.NewSpanRecorder()
	cpTr := tracing.NewWithProcessor(cpRec, tracing.Settings{ServiceName: "cart-controlplane", Role: "controlplane", SampleRatio: 1})
	dpTr := tracing.NewWithProcessor(dpRec, tracing.Settings{ServiceName: "cart-dataplane", Role: "dataplane", SampleRatio: 1})
	defer func() { _ = cpTr.Shutdown(context.Background()) }()
	defer func() { _ = dpTr.Shutdown(context.Background()) }()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cpURL, cpDone := startControlPlane(ctx, t, replica, func(*config.Config) {}, server.WithTracer(cpTr))

	dpCfg := config.Default()
	dpCfg.Server.Host, dpCfg.Server.MinOpenFiles = "127.0.0.1", 0
	dpCfg.DataPlane.ControlPlane = []string{cpURL}
	// Generous: a fallback on a busy machine would leave the control
	// plane out of the trace (the loop below would then try again).
	dpCfg.DataPlane.RouteTimeoutMs = 5000
	dpCfg.DataPlane.WorkerSyncIntervalMs = 100
	dpCfg.DataPlane.RouteStream = stream
	dpCfg.Log.Level = "error"
	dpCfg.Normalize()
	if err := dpCfg.Validate(config.RoleDataPlane); err != nil {
		t.Fatal(err)
	}
	client := cpclient.NewWithTLS(nil)
	defer client.CloseIdleConnections()
	dp, err := server.NewDataPlane(dpCfg, quiet(), client, server.WithTracer(dpTr))
	if err != nil {
		t.Fatal(err)
	}
	dpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dpDone := make(chan error, 1)
	go func() { dpDone <- dp.Run(ctx, dpLn) }()
	defer func() {
		cancel()
		for _, done := range []chan error{dpDone, cpDone} {
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				t.Error("a role did not stop")
			}
		}
	}()
	base := "http://" + dpLn.Addr().String()
	testkit.WaitFor(t, 20*time.Second, "the data plane synced with the leader", dp.Router.Synced)

	// Until the leader answers Route (election, first health probe), the
	// data plane routes locally and the trace has no control-plane part.
	var traceID string
	if stream {
		// Routes before the stream is live go unary: wait, so the stream
		// carries the traced one.
		testkit.WaitFor(t, 20*time.Second, "the Route stream live", func() bool {
			v, _, err := testkit.MetricSample(nil, base+"/metrics", "cart_route_stream_open")
			return err == nil && v == 1
		})
	}
	testkit.WaitFor(t, 20*time.Second, "a request routed by the leader", func() bool {
		id, parent := newTraceparent()
		if code, body := post(t, base, parent); code != http.StatusOK {
			t.Logf("status %d: %s", code, body)
			return false
		}
		if len(named(inTrace(cpRec, id), "cart.v1.RouterService/Route")) == 0 {
			return false
		}
		traceID = id
		return true
	})
	testkit.WaitFor(t, 5*time.Second, "the request span ends", func() bool { return len(named(inTrace(dpRec, traceID), tracing.SpanRequest)) == 1 })

	dpSpans, cpSpans := inTrace(dpRec, traceID), inTrace(cpRec, traceID)
	req := only(t, dpSpans, tracing.SpanRequest)
	route := only(t, dpSpans, tracing.SpanRoute)
	call := only(t, dpSpans, "cart.v1.RouterService/Route")
	up := only(t, dpSpans, tracing.SpanUpstream)
	srv := only(t, cpSpans, "cart.v1.RouterService/Route")
	childOf(t, route, req)
	childOf(t, call, route)
	childOf(t, srv, call)
	childOf(t, up, req)
	if call.SpanKind() != trace.SpanKindClient || srv.SpanKind() != trace.SpanKindServer || !srv.Parent().IsRemote() {
		t.Errorf("Route call kinds: data plane %v, control plane %v (remote parent %v)", call.SpanKind(), srv.SpanKind(), srv.Parent().IsRemote())
	}
	wantAttr(t, route, "cart.route.from_leader", true)
	wantAttr(t, route, "cart.route.worker", replica)
	wantAttr(t, srv, "cart.route.worker", replica)
	wantAttr(t, srv, "cart.dataplane_id", server.DataPlaneID(dpCfg))
	wantAttr(t, srv, "cart.model", "m")
	wantAttr(t, srv, "rpc.system", "grpc")
	var last seenRequest
	for _, s := range pool.requests() {
		if strings.Contains(s.traceparent, traceID) {
			last = s
		}
	}
	replicaSaw(t, last, up)

	// Background calls (Sync, batched Complete) belong to no request and
	// start no trace on either side.
	for _, s := range append(dpRec.Ended(), cpRec.Ended()...) {
		if n := s.Name(); n == "cart.v1.RouterService/Sync" || n == "cart.v1.RouterService/Complete" {
			t.Errorf("background call traced: %s", n)
			break
		}
	}
}

// A role built from a config with tracing.otlp_endpoint owns its tracer:
// its spans reach the collector, the last ones flushed when Run returns.
func TestRolesExportFromConfig(t *testing.T) {
	pool := &replicaPool{}
	replica := pool.start(t)
	for _, role := range []config.Role{config.RoleAllInOne, config.RoleDataPlane} {
		t.Run(role.String(), func(t *testing.T) {
			col := &collector{}
			cs := httptest.NewServer(col)
			defer cs.Close()
			cfg := allInOneConfig(t, replica)
			cfg.Tracing.OTLPEndpoint = cs.URL
			var run func(context.Context, net.Listener) error
			switch role {
			case config.RoleAllInOne:
				a, err := server.NewAllInOne(cfg, nil, quiet(), 1)
				if err != nil {
					t.Fatal(err)
				}
				run = a.Run
			case config.RoleDataPlane:
				// No control plane answers: the data plane routes locally.
				cfg.DataPlane.ControlPlane = []string{"http://" + testkit.FreeAddr(t)}
				if err := cfg.Validate(config.RoleDataPlane); err != nil {
					t.Fatal(err)
				}
				client := cpclient.NewWithTLS(nil)
				defer client.CloseIdleConnections()
				d, err := server.NewDataPlane(cfg, quiet(), client)
				if err != nil {
					t.Fatal(err)
				}
				run = d.Run
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- run(ctx, ln) }()
			_, parent := newTraceparent()
			code, body := post(t, "http://"+ln.Addr().String(), parent)
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}
			if code != http.StatusOK {
				t.Fatalf("status %d: %s", code, body)
			}
			svc := tracing.ServiceName(cfg.Tracing, role)
			got := col.spans()
			for _, want := range []string{tracing.SpanRequest, tracing.SpanRoute, tracing.SpanUpstream} {
				if !slices.Contains(got, svc+"/"+want) {
					t.Errorf("collector got %v, want %s/%s among them", got, svc, want)
				}
			}
		})
	}
}

// A control-plane node built from a config with tracing.otlp_endpoint
// continues traced Route calls and flushes their spans when Serve returns.
func TestControlPlaneExportsFromConfig(t *testing.T) {
	pool := &replicaPool{}
	replica := pool.start(t)
	col := &collector{}
	cs := httptest.NewServer(col)
	defer cs.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url, done := startControlPlane(ctx, t, replica, func(c *config.Config) { c.Tracing.OTLPEndpoint = cs.URL })
	client := cpclient.NewWithTLS(nil)
	defer client.CloseIdleConnections()
	rc := cartv1connect.NewRouterServiceClient(client, url, connect.WithGRPC())
	traceID, parent := newTraceparent()
	testkit.WaitFor(t, 20*time.Second, "the leader answers a traced Route", func() bool {
		req := connect.NewRequest(&cartv1.RouteRequest{Endpoint: "chat_completions", Model: "m", Text: "hello", DataplaneId: "test", DryRun: true})
		req.Header().Set("Traceparent", parent)
		resp, err := rc.Route(ctx, req)
		return err == nil && resp.Msg.GetFromLeader()
	})
	cancel()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the control plane did not stop")
	}
	if got := col.spans(); !slices.Contains(got, "cart-controlplane/cart.v1.RouterService/Route") {
		t.Errorf("collector got %v, want the node's Route span", got)
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	for _, r := range col.reqs {
		for _, rs := range r.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					if hex.EncodeToString(s.GetTraceId()) != traceID || hex.EncodeToString(s.GetParentSpanId()) != parent[36:52] {
						t.Errorf("span %s: trace %x parent %x, want the caller's %s", s.GetName(), s.GetTraceId(), s.GetParentSpanId(), parent)
					}
				}
			}
		}
	}
}
