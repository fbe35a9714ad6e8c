package tracing_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/dataplane/router"
	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/internal/tracing"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testkit.IdleHTTPConns()...)
}

// recorded builds a Tracer that keeps every finished span in memory.
func recorded(t testing.TB, ratio float64) (*tracing.Tracer, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tr := tracing.NewWithProcessor(rec, tracing.Settings{ServiceName: "cart-test", Role: "all-in-one", SampleRatio: ratio})
	t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
	return tr, rec
}

const (
	clientTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpanID  = "00f067aa0ba902b7"
	clientParent  = "00-" + clientTraceID + "-" + clientSpanID + "-01"
)

func spansNamed(rec *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func attr(s sdktrace.ReadOnlySpan, key string) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

func wantAttr(t *testing.T, s sdktrace.ReadOnlySpan, key string, want any) {
	t.Helper()
	v, ok := attr(s, key)
	if !ok {
		t.Errorf("span %s has no attribute %s (has %v)", s.Name(), key, s.Attributes())
		return
	}
	if got := v.AsInterface(); got != want {
		t.Errorf("span %s: %s = %v (%T), want %v (%T)", s.Name(), key, got, got, want, want)
	}
}

// upstream is a RoundTripper that records what it was sent.
type upstream struct {
	status int
	err    error
	got    *http.Request
}

func (u *upstream) RoundTrip(r *http.Request) (*http.Response, error) {
	u.got = r
	if u.err != nil {
		return nil, u.err
	}
	return &http.Response{StatusCode: u.status, Status: http.StatusText(u.status), Header: http.Header{}, Body: io.NopCloser(strings.NewReader("{}")), Request: r}, nil
}

func TestOffWhenNoEndpoint(t *testing.T) {
	tr, err := tracing.New(config.Default().Tracing, config.RoleDataPlane, "dp")
	if err != nil || tr != nil {
		t.Fatalf("New without otlp_endpoint = %v, %v; want nil (off)", tr, err)
	}
	h := http.NewServeMux()
	if got := tr.Handler(h); got != http.Handler(h) {
		t.Errorf("Handler off wraps the handler")
	}
	var r router.Router = fakeRouter{}
	if got := router.Traced(tr, r); got != r {
		t.Errorf("WrapRouter off wraps the router")
	}
	if tr.Interceptors() != nil {
		t.Errorf("Interceptors off are not nil")
	}
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown on nil: %v", err)
	}
}

// With tracing off, the client's trace context is nobody's business but the
// replica's: it passes unchanged, on the very request the proxy built.
func TestOffPassesTraceparentUnchanged(t *testing.T) {
	var tr *tracing.Tracer
	up := &upstream{status: 200}
	req := httptest.NewRequest(http.MethodPost, "http://replica/v1/chat/completions", nil)
	req.Header.Set("Traceparent", clientParent)
	req.Header.Set("Tracestate", "vendor=abc")
	resp, err := tr.RoundTrip(up, req, "http://replica", 1)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if up.got != req {
		t.Errorf("tracing off: the upstream got a copy of the request, not the request")
	}
	if got := up.got.Header.Get("Traceparent"); got != clientParent {
		t.Errorf("traceparent = %q, want %q", got, clientParent)
	}
	if got := up.got.Header.Get("Tracestate"); got != "vendor=abc" {
		t.Errorf("tracestate = %q", got)
	}
}

type nopRT struct{ resp *http.Response }

func (n nopRT) RoundTrip(*http.Request) (*http.Response, error) { return n.resp, nil }

// The hooks the proxy calls on every request cost nothing with tracing off.
func TestHooksOffAllocateNothing(t *testing.T) {
	var tr *tracing.Tracer
	rt := nopRT{resp: &http.Response{StatusCode: 200, Body: http.NoBody}}
	req := httptest.NewRequest(http.MethodPost, "http://replica/v1/chat/completions", nil)
	ctx := req.Context()
	allocs := testing.AllocsPerRun(1000, func() {
		resp, _ := tr.RoundTrip(rt, req, "http://replica", 1)
		_ = resp
		tracing.Annotate(ctx, "chat_completions", "team-a", "m", "http://replica")
	})
	if allocs != 0 {
		t.Errorf("tracing off: %v allocations per request in the hooks, want 0", allocs)
	}
	// An unsampled request with tracing on annotates nothing either.
	on, _ := recorded(t, 0)
	h := on.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a := testing.AllocsPerRun(100, func() { tracing.Annotate(r.Context(), "chat_completions", "team-a", "m", "w") })
		if a != 0 {
			t.Errorf("unsampled request: Annotate allocates %v", a)
		}
	}))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
}

// BenchmarkHooksOff and BenchmarkHooksBaseline compare one upstream attempt
// plus the request annotation with tracing off against the bare round trip
// the proxy made before tracing existed: both must report 0 allocs/op.
func BenchmarkHooksOff(b *testing.B) {
	var tr *tracing.Tracer
	rt := nopRT{resp: &http.Response{StatusCode: 200, Body: http.NoBody}}
	req := httptest.NewRequest(http.MethodPost, "http://replica/v1/chat/completions", nil)
	ctx := req.Context()
	b.ReportAllocs()
	for b.Loop() {
		_, _ = tr.RoundTrip(rt, req, "http://replica", 1)
		tracing.Annotate(ctx, "chat_completions", "team-a", "m", "http://replica")
	}
}

func BenchmarkHooksBaseline(b *testing.B) {
	var rt http.RoundTripper = nopRT{resp: &http.Response{StatusCode: 200, Body: http.NoBody}}
	req := httptest.NewRequest(http.MethodPost, "http://replica/v1/chat/completions", nil)
	b.ReportAllocs()
	for b.Loop() {
		_, _ = rt.RoundTrip(req)
	}
}

// freshRT answers a new response each time (RoundTrip wraps its body).
type freshRT struct{}

func (freshRT) RoundTrip(*http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Body: http.NoBody}, nil
}

// BenchmarkHooksOn is what a sampled request pays for its spans (request,
// attempt), the response and the request copy included.
func BenchmarkHooksOn(b *testing.B) {
	tr := tracing.NewWithProcessor(sdktrace.NewSimpleSpanProcessor(tracetest.NewNoopExporter()), tracing.Settings{ServiceName: "bench", SampleRatio: 1})
	defer func() { _ = tr.Shutdown(context.Background()) }()
	rt := freshRT{}
	h := tr.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out := r.Clone(r.Context())
		resp, _ := tr.RoundTrip(rt, out, "http://replica", 1)
		_ = resp.Body.Close()
		tracing.Annotate(r.Context(), "chat_completions", "team-a", "m", "http://replica")
	}))
	req := httptest.NewRequest(http.MethodPost, "http://cart/v1/chat/completions", nil)
	w := httptest.NewRecorder()
	b.ReportAllocs()
	for b.Loop() {
		h.ServeHTTP(w, req)
	}
}

func TestRoundTripPropagatesAttemptContext(t *testing.T) {
	tr, rec := recorded(t, 1)
	up := &upstream{status: 200}
	var seenParent trace.SpanContext
	h := tr.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seenParent = trace.SpanContextFromContext(r.Context())
		out := httptest.NewRequestWithContext(r.Context(), http.MethodPost, "http://10.0.0.7:8000/v1/chat/completions", nil)
		out.Header = r.Header // the proxy's outbound headers, shared by attempts
		resp, err := tr.RoundTrip(up, out, "http://10.0.0.7:8000", 2)
		if err != nil {
			t.Error(err)
			return
		}
		if len(rec.Ended()) != 0 {
			t.Errorf("the attempt span ended before its body was closed")
		}
		_ = resp.Body.Close()
		_ = resp.Body.Close() // a second close ends nothing twice
		w.WriteHeader(resp.StatusCode)
	}))
	in := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	in.Header.Set("Traceparent", clientParent)
	in.Header.Set("Tracestate", "vendor=abc")
	h.ServeHTTP(httptest.NewRecorder(), in)

	if got := in.Header.Get("Traceparent"); got != clientParent {
		t.Errorf("the attempt wrote its traceparent into the shared headers: %q", got)
	}
	ups := spansNamed(rec, tracing.SpanUpstream)
	reqs := spansNamed(rec, tracing.SpanRequest)
	if len(ups) != 1 || len(reqs) != 1 {
		t.Fatalf("spans: %d upstream, %d request; want 1 and 1", len(ups), len(reqs))
	}
	u, r := ups[0], reqs[0]
	if r.Parent().SpanID().String() != clientSpanID || r.SpanContext().TraceID().String() != clientTraceID || !r.Parent().IsRemote() {
		t.Errorf("request span parent = %v, want the client's span %s of trace %s", r.Parent(), clientSpanID, clientTraceID)
	}
	if seenParent.SpanID() != r.SpanContext().SpanID() {
		t.Errorf("the handler's context does not carry the request span")
	}
	if u.Parent().SpanID() != r.SpanContext().SpanID() || u.SpanKind() != trace.SpanKindClient {
		t.Errorf("upstream span parent %v kind %v; want the request span, client", u.Parent().SpanID(), u.SpanKind())
	}
	want := "00-" + clientTraceID + "-" + u.SpanContext().SpanID().String() + "-01"
	if got := up.got.Header.Get("Traceparent"); got != want {
		t.Errorf("replica traceparent = %q, want %q", got, want)
	}
	if got := up.got.Header.Get("Tracestate"); got != "vendor=abc" {
		t.Errorf("replica tracestate = %q, want the caller's", got)
	}
	wantAttr(t, u, "cart.worker", "http://10.0.0.7:8000")
	wantAttr(t, u, "cart.attempt", int64(2))
	wantAttr(t, u, "cart.outcome", "response")
	wantAttr(t, u, "http.response.status_code", int64(200))
	wantAttr(t, r, "http.response.status_code", int64(200))
	if r.SpanKind() != trace.SpanKindServer {
		t.Errorf("request span kind %v", r.SpanKind())
	}
}

func TestRoundTripOutcomes(t *testing.T) {
	tr, rec := recorded(t, 1)
	ctx, root := tr.Start(context.Background())
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "http://w:1/v1/completions", nil)
	if _, err := tr.RoundTrip(&upstream{err: errors.New("dial tcp: connection refused")}, req, "http://w:1", 1); err == nil {
		t.Fatal("want the transport error back")
	}
	resp, err := tr.RoundTrip(&upstream{status: 503}, req, "http://w:2", 2)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	root.End()
	ups := spansNamed(rec, tracing.SpanUpstream)
	if len(ups) != 2 {
		t.Fatalf("%d upstream spans, want 2", len(ups))
	}
	wantAttr(t, ups[0], "cart.outcome", "error")
	if ups[0].Status().Code != codes.Error || !strings.Contains(ups[0].Status().Description, "connection refused") {
		t.Errorf("failed attempt status = %v", ups[0].Status())
	}
	wantAttr(t, ups[1], "http.response.status_code", int64(503))
	if ups[1].Status().Code != codes.Error {
		t.Errorf("503 attempt status = %v, want Error", ups[1].Status())
	}
	for _, u := range ups {
		if u.Parent().SpanID() != root.SpanContext().SpanID() {
			t.Errorf("attempt %v is not a child of the request", u.Attributes())
		}
	}
}

func TestRequestSpanStatus(t *testing.T) {
	tr, rec := recorded(t, 1)
	serve := func(h http.HandlerFunc, ctx context.Context) sdktrace.ReadOnlySpan {
		t.Helper()
		n := len(rec.Ended())
		r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/messages", nil)
		func() {
			defer func() { _ = recover() }()
			tr.Handler(h).ServeHTTP(httptest.NewRecorder(), r)
		}()
		if len(rec.Ended()) != n+1 {
			t.Fatalf("no request span ended")
		}
		return rec.Ended()[n]
	}
	s := serve(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusEarlyHints)
		http.Error(w, "busy", http.StatusServiceUnavailable)
	}, context.Background())
	wantAttr(t, s, "http.response.status_code", int64(503))
	if s.Status().Code != codes.Error {
		t.Errorf("503: status %v, want Error", s.Status())
	}
	s = serve(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "bad", http.StatusBadRequest) }, context.Background())
	wantAttr(t, s, "http.response.status_code", int64(400))
	if s.Status().Code == codes.Error {
		t.Errorf("400 is the client's error, not the server's: status %v", s.Status())
	}
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	s = serve(func(w http.ResponseWriter, r *http.Request) { panic(http.ErrAbortHandler) }, gone)
	wantAttr(t, s, "http.response.status_code", int64(499))
	if s.Status().Code == codes.Error {
		t.Errorf("a client hang-up is not a server error: %v", s.Status())
	}
	s = serve(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "partial")
		panic(http.ErrAbortHandler)
	}, context.Background())
	if s.Status().Code != codes.Error {
		t.Errorf("an aborted response is an error: %v", s.Status())
	}
}

func TestProbesNotTraced(t *testing.T) {
	tr, rec := recorded(t, 1)
	served := 0
	h := tr.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served++ }))
	for _, path := range []string{"/health", "/metrics", "/v1/models"} {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, path, nil))
	}
	if served != 3 {
		t.Fatalf("served %d of 3 requests", served)
	}
	if got := rec.Ended(); len(got) != 1 {
		t.Errorf("%d spans, want 1 (/v1/models only; probes and scrapes are not traced)", len(got))
	}
}

func TestAnnotate(t *testing.T) {
	tr, rec := recorded(t, 1)
	long := strings.Repeat("m", 1000)
	tr.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tracing.Annotate(r.Context(), "chat_completions", "team-a", long, "http://w:1")
	})).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil))
	s := spansNamed(rec, tracing.SpanRequest)[0]
	wantAttr(t, s, "cart.endpoint", "chat_completions")
	wantAttr(t, s, "cart.tenant", "team-a")
	wantAttr(t, s, "cart.worker", "http://w:1")
	if v, _ := attr(s, "cart.model"); len(v.AsString()) != 256 {
		t.Errorf("a 1000-byte model name is kept as %d bytes, want 256", len(v.AsString()))
	}
}

// Sampling is parent-based: the ratio decides for requests that arrive
// without a trace, the caller's flag for those that carry one, and an
// unsampled request still passes its trace on, flagged unsampled.
func TestSampling(t *testing.T) {
	tr, rec := recorded(t, 0)
	up := &upstream{status: 200}
	h := tr.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out := httptest.NewRequestWithContext(r.Context(), http.MethodPost, "http://w:1/", nil)
		resp, err := tr.RoundTrip(up, out, "http://w:1", 1)
		if err == nil {
			_ = resp.Body.Close()
		}
	}))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/", nil))
	if n := len(rec.Ended()); n != 0 {
		t.Errorf("ratio 0, no traceparent: %d spans recorded, want 0", n)
	}
	if tp := up.got.Header.Get("Traceparent"); !strings.HasSuffix(tp, "-00") {
		t.Errorf("unsampled request: replica traceparent %q, want one flagged unsampled", tp)
	}

	in := httptest.NewRequest(http.MethodPost, "/", nil)
	in.Header.Set("Traceparent", clientParent)
	h.ServeHTTP(httptest.NewRecorder(), in)
	if n := len(rec.Ended()); n != 2 {
		t.Errorf("ratio 0, sampled traceparent: %d spans recorded, want 2 (the caller decides)", n)
	}

	in = httptest.NewRequest(http.MethodPost, "/", nil)
	in.Header.Set("Traceparent", "00-"+clientTraceID+"-"+clientSpanID+"-00")
	n := len(rec.Ended())
	all, allRec := recorded(t, 1)
	all.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out := httptest.NewRequestWithContext(r.Context(), http.MethodPost, "http://w:1/", nil)
		resp, err := all.RoundTrip(up, out, "http://w:1", 1)
		if err == nil {
			_ = resp.Body.Close()
		}
	})).ServeHTTP(httptest.NewRecorder(), in)
	if len(allRec.Ended()) != 0 || len(rec.Ended()) != n {
		t.Errorf("ratio 1, unsampled traceparent: %d spans recorded, want 0 (the caller decides)", len(allRec.Ended()))
	}
	if tp := up.got.Header.Get("Traceparent"); !strings.HasPrefix(tp, "00-"+clientTraceID+"-") || !strings.HasSuffix(tp, "-00") {
		t.Errorf("unsampled caller: replica traceparent %q, want the caller's trace, unsampled", tp)
	}
}

// A malformed traceparent starts a new trace; the tracestate sent beside it
// must not travel on as if it belonged to that trace.
func TestMalformedTraceparentDropsTracestate(t *testing.T) {
	tr, rec := recorded(t, 1)
	up := &upstream{status: 200}
	in := httptest.NewRequest(http.MethodPost, "/", nil)
	in.Header.Set("Traceparent", "00-not-a-trace-01")
	in.Header.Set("Tracestate", "vendor=abc")
	tr.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out := httptest.NewRequestWithContext(r.Context(), http.MethodPost, "http://w:1/", nil)
		out.Header = r.Header
		resp, err := tr.RoundTrip(up, out, "http://w:1", 1)
		if err == nil {
			_ = resp.Body.Close()
		}
	})).ServeHTTP(httptest.NewRecorder(), in)
	req := spansNamed(rec, tracing.SpanRequest)[0]
	if req.Parent().IsValid() {
		t.Errorf("a malformed traceparent became a parent: %v", req.Parent())
	}
	if got := up.got.Header.Get("Tracestate"); got != "" {
		t.Errorf("replica got tracestate %q from the discarded trace", got)
	}
	if got := up.got.Header.Get("Traceparent"); !strings.Contains(got, req.SpanContext().TraceID().String()) {
		t.Errorf("replica traceparent %q is not CART's new trace", got)
	}
}

type fakeRouter struct{ err error }

func (f fakeRouter) Decide(ctx context.Context, req *router.Request) (router.Decision, error) {
	if f.err != nil {
		return router.Decision{}, f.err
	}
	return router.Decision{Worker: "http://w:1", Reason: "cache_hit", MatchedRatio: 0.75, MatchedChars: 192, Candidate: "http://w:1", FromLeader: true}, nil
}
func (fakeRouter) Done(router.Decision, router.Outcome) {}
func (fakeRouter) Workers() []router.WorkerStatus       { return nil }

type learningRouter struct {
	fakeRouter
	learned []string
}

func (l *learningRouter) LearnResponse(_ context.Context, id, worker, tenant string) {
	l.learned = append(l.learned, id+"@"+worker+"/"+tenant)
}

func TestWrapRouter(t *testing.T) {
	tr, rec := recorded(t, 1)
	ctx, root := tr.Start(context.Background())
	r := router.Traced(tr, fakeRouter{})
	if _, ok := r.(router.ResponseLearner); ok {
		t.Errorf("the wrapper claims ResponseLearner for a router without it")
	}
	d, err := r.Decide(ctx, &router.Request{Hashes: []uint64{1, 2, 3}, Exclude: []string{"http://w:2"}})
	if err != nil || d.Worker != "http://w:1" {
		t.Fatalf("Route = %+v, %v", d, err)
	}
	if _, err := router.Traced(tr, fakeRouter{err: router.ErrUnavailable}).Decide(ctx, &router.Request{}); !errors.Is(err, router.ErrUnavailable) {
		t.Fatalf("error not passed through: %v", err)
	}
	root.End()
	rs := spansNamed(rec, tracing.SpanRoute)
	if len(rs) != 2 {
		t.Fatalf("%d route spans, want 2", len(rs))
	}
	s := rs[0]
	if s.Parent().SpanID() != root.SpanContext().SpanID() {
		t.Errorf("route span is not a child of the request")
	}
	wantAttr(t, s, "cart.route.worker", "http://w:1")
	wantAttr(t, s, "cart.route.reason", "cache_hit")
	wantAttr(t, s, "cart.route.matched_ratio", 0.75)
	wantAttr(t, s, "cart.route.matched_chars", int64(192))
	wantAttr(t, s, "cart.route.from_leader", true)
	wantAttr(t, s, "cart.route.blocks", int64(3))
	wantAttr(t, s, "cart.route.excluded", int64(1))
	if rs[1].Status().Code != codes.Error {
		t.Errorf("failed route: status %v", rs[1].Status())
	}

	lr := &learningRouter{}
	wl, ok := router.Traced(tr, lr).(router.ResponseLearner)
	if !ok {
		t.Fatal("the wrapper hides the router's ResponseLearner")
	}
	wl.LearnResponse(ctx, "resp_1", "http://w:1", "team-a")
	if len(lr.learned) != 1 || lr.learned[0] != "resp_1@http://w:1/team-a" {
		t.Errorf("LearnResponse not forwarded: %v", lr.learned)
	}
}
