package tracing

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Span names CART uses; docs/tracing.md lists them with their attributes.
const (
	SpanRequest  = "cart.request"  // server: one client request, start to last byte
	SpanRoute    = "cart.route"    // internal: one routing decision
	SpanUpstream = "cart.upstream" // client: one attempt at one replica
)

// Handler wraps the client-facing handler in the request span: the
// caller's traceparent (if any) is its parent, and it ends when the
// handler returns, after the last byte of a stream. GET /health and
// /metrics are not traced. Off: h itself.
func (t *Tracer) Handler(h http.Handler) http.Handler {
	if t == nil {
		return h
	}
	return &serverHandler{t: t, next: h}
}

type serverHandler struct {
	t    *Tracer
	next http.Handler
}

func (s *serverHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/health" || r.URL.Path == "/metrics" {
		// Load balancer probes and scrapes every few seconds would bury
		// the requests in traces of their own.
		s.next.ServeHTTP(w, r)
		return
	}
	ctx := s.t.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, sp := s.t.tr.Start(ctx, SpanRequest, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		attribute.String("http.request.method", r.Method),
		attribute.String("url.path", clip(r.URL.Path)),
	))
	rec := &statusRecorder{ResponseWriter: w}
	defer func() {
		v := recover()
		status := rec.status
		switch {
		case r.Context().Err() != nil && (v != nil || status == 0 || rec.writeFailed):
			// The client went away: the proxy logs and counts this as 499.
			status = 499
		case status == 0:
			status = http.StatusOK // what net/http sends for a handler that wrote nothing
		}
		sp.SetAttributes(attribute.Int("http.response.status_code", status))
		switch {
		case v != nil && status != 499:
			sp.SetStatus(codes.Error, "response aborted")
		case status >= 500 && status != 499:
			sp.SetStatus(codes.Error, http.StatusText(status))
		}
		sp.End()
		if v != nil {
			panic(v) // http.ErrAbortHandler: the server drops the connection
		}
	}()
	s.next.ServeHTTP(rec, r.WithContext(ctx))
}

// statusRecorder notes the status sent. It unwraps for
// http.ResponseController, so flushes and deadlines reach the connection.
type statusRecorder struct {
	http.ResponseWriter
	status      int
	writeFailed bool
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 && code >= 200 { // 1xx are interim
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	n, err := s.ResponseWriter.Write(b)
	if err != nil {
		s.writeFailed = true
	}
	return n, err
}

// Flush serves callers that assert http.Flusher rather than use a
// ResponseController.
func (s *statusRecorder) Flush() { _ = http.NewResponseController(s.ResponseWriter).Flush() }

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// Annotate adds what the proxy learned about a request to its request
// span: endpoint and tenant labels, the requested model and the replica
// that answered ("" when none did). Off, or for an unsampled request, it
// returns before building a single attribute.
func Annotate(ctx context.Context, endpoint, tenant, model, worker string) {
	sp := trace.SpanFromContext(ctx)
	if !sp.IsRecording() {
		return
	}
	sp.SetAttributes(
		attribute.String("cart.endpoint", endpoint),
		attribute.String("cart.tenant", tenant),
		attribute.String("cart.model", clip(model)),
		attribute.String("cart.worker", worker),
	)
}

// RoundTrip sends one attempt of a request to a replica through rt, as a
// child span of the request (attempt is 1-based: 2 and up are retries).
// The replica receives the attempt's traceparent (and the caller's
// tracestate) on a copy of the headers, so concurrent attempts never share
// a header map. The span ends when the response body is closed, so it
// covers the whole upstream exchange, stream included. Off: rt.RoundTrip.
func (t *Tracer) RoundTrip(rt http.RoundTripper, req *http.Request, worker string, attempt int) (*http.Response, error) {
	if t == nil {
		return rt.RoundTrip(req)
	}
	ctx, sp := t.tr.Start(req.Context(), SpanUpstream, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String("cart.worker", worker),
		attribute.Int("cart.attempt", attempt),
		attribute.String("http.request.method", req.Method),
		attribute.String("server.address", req.URL.Host),
	))
	out := req.WithContext(ctx)
	out.Header = req.Header.Clone()
	if out.Header == nil {
		out.Header = http.Header{}
	}
	// A tracestate the caller sent beside an unusable traceparent belongs
	// to no trace CART continues: Inject writes it back only when the
	// span context carries it.
	out.Header.Del("Tracestate")
	t.prop.Inject(ctx, propagation.HeaderCarrier(out.Header))
	resp, err := rt.RoundTrip(out)
	if err != nil {
		sp.SetAttributes(attribute.String("cart.outcome", "error"))
		sp.SetStatus(codes.Error, err.Error())
		sp.End()
		return nil, err
	}
	sp.SetAttributes(attribute.String("cart.outcome", "response"), attribute.Int("http.response.status_code", resp.StatusCode))
	if resp.StatusCode >= 400 {
		sp.SetStatus(codes.Error, resp.Status)
	}
	resp.Body = &spanBody{ReadCloser: resp.Body, sp: sp}
	return resp, nil
}

// spanBody ends an attempt's span when its body is first closed (the
// proxy always closes it: normal end, client gone, retry), marking a stream
// that broke off. Close may come from another goroutine than Read (a stall
// timer), hence the lock.
type spanBody struct {
	io.ReadCloser
	mu     sync.Mutex
	sp     trace.Span // nil once ended
	broken error
}

func (b *spanBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		b.mu.Lock()
		if b.broken == nil {
			b.broken = err
		}
		b.mu.Unlock()
	}
	return n, err
}

func (b *spanBody) Close() error {
	err := b.ReadCloser.Close()
	b.mu.Lock()
	sp, broken := b.sp, b.broken
	b.sp = nil
	b.mu.Unlock()
	if sp != nil {
		if broken != nil {
			sp.SetStatus(codes.Error, "response body: "+broken.Error())
		}
		sp.End()
	}
	return err
}
