// Package tracing is CART's OpenTelemetry instrumentation: it builds the
// tracer provider from tracing.* and holds every hook the request path
// calls, so the proxy, the routers and the control-plane API each need one
// line to be traced.
//
// A nil *Tracer is tracing off. Every hook checks for it first and then
// does nothing the untraced code would not do: no span, no header copy, no
// allocation (TestHooksOffAllocateNothing, BenchmarkHooksOff). The
// wrappers (Handler, Interceptors; router.Traced in the data plane) return their argument or nil
// when off, so the request path does not even pass through them.
//
// Propagation is W3C trace context (traceparent, tracestate) only. With
// tracing off, CART does not touch those headers: a client's traceparent
// reaches the replica unchanged, as through any proxy.
package tracing

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/cartrouter/cart/config"
)

// instrumentationName names CART's tracer (the instrumentation scope).
const instrumentationName = "github.com/cartrouter/cart"

// exportTimeout bounds one OTLP export: a collector that hangs must not
// hold spans (and memory) for the exporter's 10 s default per batch.
const exportTimeout = 5 * time.Second

// Tracer starts CART's spans. The zero value is not usable; nil is tracing
// off.
type Tracer struct {
	tp   *sdktrace.TracerProvider
	tr   trace.Tracer
	prop propagation.TraceContext
}

// StartSpan starts a span with this tracer, for wrappers kept beside the
// code they trace (the data plane's router).
func (t *Tracer) StartSpan(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	return t.tr.Start(ctx, name, opts...)
}

// Settings describe the process whose spans a Tracer exports.
type Settings struct {
	// ServiceName is the service.name resource attribute.
	ServiceName string
	// Role is the cart.role resource attribute (all-in-one, dataplane,
	// controlplane).
	Role string
	// InstanceID is service.instance.id (node or data-plane id); "" leaves
	// it out.
	InstanceID string
	// SampleRatio is the fraction of new traces recorded; a span whose
	// parent came with the request follows the parent's sampled flag.
	SampleRatio float64
}

// ServiceName is the service.name a role exports under: tracing.service_name
// when set, else one per role, so a trace shows which hop is which.
func ServiceName(c config.Tracing, role config.Role) string {
	if c.ServiceName != "" {
		return c.ServiceName
	}
	return "cart-" + role.String()
}

// New builds the tracer tracing.* describes for role, exporting over
// OTLP/HTTP through a batching processor; nil (tracing off) when
// tracing.otlp_endpoint is empty. Nothing is dialled here: a collector that
// is down costs dropped spans and a log line from the exporter, never a
// failed start. Shutdown flushes.
func New(c config.Tracing, role config.Role, instanceID string) (*Tracer, error) {
	if !c.Enabled() {
		return nil, nil
	}
	opts, err := exporterOptions(c)
	if err != nil {
		return nil, err
	}
	exp, err := otlptracehttp.New(context.Background(), opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	return NewWithProcessor(sdktrace.NewBatchSpanProcessor(exp), Settings{
		ServiceName: ServiceName(c, role), Role: role.String(), InstanceID: instanceID, SampleRatio: c.SampleRatio,
	}), nil
}

// Check reports what New would refuse in c (an unreadable or empty
// tracing.ca_file), building nothing: --config-check runs it.
func Check(c config.Tracing) error {
	if !c.Enabled() {
		return nil
	}
	_, err := exporterOptions(c)
	return err
}

// exporterOptions turns tracing.* into OTLP/HTTP exporter options. Options
// given here win over the OTEL_EXPORTER_OTLP_* environment, which still
// supplies what CART has no key for (headers, compression).
func exporterOptions(c config.Tracing) ([]otlptracehttp.Option, error) {
	u, err := url.Parse(c.OTLPEndpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("tracing.otlp_endpoint %q: want http:// or https:// with a host", c.OTLPEndpoint)
	}
	path := u.EscapedPath()
	if path == "" || path == "/" {
		// A bare collector address, as OTEL_EXPORTER_OTLP_ENDPOINT is
		// usually written: the traces signal lives under /v1/traces.
		path = "/v1/traces"
	}
	opts := []otlptracehttp.Option{
		otlptracehttp.WithEndpoint(u.Host),
		otlptracehttp.WithURLPath(path),
		otlptracehttp.WithTimeout(exportTimeout),
	}
	if u.Scheme == "http" {
		return append(opts, otlptracehttp.WithInsecure()), nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tracing.ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tracing.ca_file %s: no certificates found", c.CAFile)
		}
		tc.RootCAs = pool
	}
	return append(opts, otlptracehttp.WithTLSClientConfig(tc)), nil
}

// NewWithProcessor builds a Tracer that hands finished spans to sp: New
// passes a batching OTLP exporter, tests an in-memory recorder
// (go.opentelemetry.io/otel/sdk/trace/tracetest).
func NewWithProcessor(sp sdktrace.SpanProcessor, s Settings) *Tracer {
	attrs := []attribute.KeyValue{attribute.String("service.name", s.ServiceName), attribute.String("cart.role", s.Role)}
	if s.InstanceID != "" {
		attrs = append(attrs, attribute.String("service.instance.id", s.InstanceID))
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attrs...))
	if err != nil {
		// Only conflicting schema URLs fail a merge, and ours has none;
		// should it happen anyway, CART's own attributes matter most.
		res = resource.NewSchemaless(attrs...)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSpanProcessor(sp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(s.SampleRatio))),
	)
	return &Tracer{tp: tp, tr: tp.Tracer(instrumentationName)}
}

// Shutdown exports the spans still buffered and stops the exporter; spans
// ended after it are dropped. Safe on nil and more than once.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.tp.Shutdown(ctx)
}

// LogErrors sends the OpenTelemetry SDK's errors (failed exports, dropped
// spans) to log as warnings, in the process's log format, instead of the
// SDK's default plain-text line on stderr. The SDK has one error handler
// per process, so the last call wins.
func LogErrors(log *slog.Logger) {
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("tracing: span export failed; spans are dropped while the collector is unreachable", "error", err.Error())
	}))
}

// ShutdownTimeout is how long Close waits for the last export.
const ShutdownTimeout = 5 * time.Second

// Close is Shutdown with ShutdownTimeout, for deferred calls at the end of
// a role's Run.
func (t *Tracer) Close() error {
	if t == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	err := t.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("tracing: spans not exported within %v at shutdown (collector unreachable?): %w", ShutdownTimeout, err)
	}
	return err
}

// maxAttrLen bounds a client-chosen string (model name) in a span
// attribute, as the proxy bounds it in log lines.
const maxAttrLen = 256

func clip(s string) string {
	if len(s) <= maxAttrLen {
		return s
	}
	return s[:maxAttrLen]
}
