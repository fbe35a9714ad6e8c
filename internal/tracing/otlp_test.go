package tracing_test

import (
	"encoding/pem"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/internal/tracing"
)

// collector is an OTLP/HTTP receiver: it decodes every export it is sent.
type collector struct {
	mu    sync.Mutex
	paths []string
	reqs  []*collectortrace.ExportTraceServiceRequest
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var req collectortrace.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(body, &req)
	}
	if err != nil || r.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "bad export", http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	c.paths = append(c.paths, r.URL.Path)
	c.reqs = append(c.reqs, &req)
	c.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	b, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	_, _ = w.Write(b)
}

// spans lists the exported spans as "service.name/span name".
func (c *collector) spans() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, r := range c.reqs {
		for _, rs := range r.GetResourceSpans() {
			svc := ""
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.GetKey() == "service.name" {
					svc = kv.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					out = append(out, svc+"/"+s.GetName())
				}
			}
		}
	}
	return out
}

// traceOneRequest sends one request through tr's request span and shuts
// tr down: the batching exporter holds the span until Shutdown flushes it.
func traceOneRequest(t *testing.T, tr *tracing.Tracer) {
	t.Helper()
	tr.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})).
		ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil))
	if err := tr.Close(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
}

func TestOTLPExportFlushedAtShutdown(t *testing.T) {
	col := &collector{}
	srv := httptest.NewServer(col)
	defer srv.Close()
	c := config.Default().Tracing
	c.OTLPEndpoint = srv.URL
	tr, err := tracing.New(c, config.RoleDataPlane, "dp-1")
	if err != nil || tr == nil {
		t.Fatalf("New = %v, %v", tr, err)
	}
	traceOneRequest(t, tr)
	if got := col.spans(); !slices.Equal(got, []string{"cart-dataplane/" + tracing.SpanRequest}) {
		t.Errorf("exported %v, want the request span of cart-dataplane", got)
	}
	if !slices.Equal(col.paths, []string{"/v1/traces"}) {
		t.Errorf("export paths %v, want /v1/traces under a bare collector URL", col.paths)
	}
}

func TestOTLPExportTLSWithCAFileAndPath(t *testing.T) {
	col := &collector{}
	srv := httptest.NewTLSServer(col)
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	c := config.Tracing{OTLPEndpoint: srv.URL + "/otlp/v1/traces", CAFile: ca, SampleRatio: 1, ServiceName: "edge-cart"}
	tr, err := tracing.New(c, config.RoleControlPlane, "n1")
	if err != nil {
		t.Fatal(err)
	}
	traceOneRequest(t, tr)
	if got := col.spans(); !slices.Equal(got, []string{"edge-cart/" + tracing.SpanRequest}) {
		t.Errorf("exported %v, want one span under service_name edge-cart", got)
	}
	if !slices.Equal(col.paths, []string{"/otlp/v1/traces"}) {
		t.Errorf("export paths %v, want the configured path", col.paths)
	}
}

func TestNewRefusesBadCAFile(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(bad, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, ca := range []string{bad, filepath.Join(t.TempDir(), "missing.pem")} {
		tr, err := tracing.New(config.Tracing{OTLPEndpoint: "https://collector:4318", CAFile: ca, SampleRatio: 1}, config.RoleAllInOne, "")
		if err == nil {
			_ = tr.Close()
			t.Errorf("ca_file %s accepted", ca)
		}
	}
}

func TestServiceNamePerRole(t *testing.T) {
	for role, want := range map[config.Role]string{
		config.RoleAllInOne: "cart-all-in-one", config.RoleDataPlane: "cart-dataplane", config.RoleControlPlane: "cart-controlplane",
	} {
		if got := tracing.ServiceName(config.Tracing{}, role); got != want {
			t.Errorf("%v: service name %q, want %q", role, got, want)
		}
	}
	if got := tracing.ServiceName(config.Tracing{ServiceName: "x"}, config.RoleDataPlane); got != "x" {
		t.Errorf("service_name not used: %q", got)
	}
}

func TestExportErrorsLogged(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "collector broken", http.StatusBadRequest)
	}))
	defer srv.Close()
	rec := testkit.NewLogRecorder()
	tracing.LogErrors(slog.New(rec))
	defer tracing.LogErrors(slog.New(slog.DiscardHandler))
	tr, err := tracing.New(config.Tracing{OTLPEndpoint: srv.URL, SampleRatio: 1}, config.RoleAllInOne, "")
	if err != nil {
		t.Fatal(err)
	}
	tr.Handler(http.NotFoundHandler()).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
	_ = tr.Close()
	testkit.WaitFor(t, 5*time.Second, "the failed export is logged", func() bool {
		return rec.Count(slog.LevelWarn, "span export failed") > 0
	})
}
