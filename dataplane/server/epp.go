package server

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/dataplane/epp"
	"github.com/cartrouter/cart/dataplane/metrics"
	"github.com/cartrouter/cart/dataplane/router"
	"github.com/cartrouter/cart/internal/every"
)

// EPP is CART as a Gateway API Inference Extension endpoint picker: an
// all-in-one router or a data plane (with dataplane.control_plane), whose
// proxy handler answers a gateway's ext_proc streams instead of HTTP
// clients. Everything around the router (health checks, discovery, KV
// events, the control-plane client, metrics) is the role's own.
type EPP struct {
	AllInOne  *AllInOne  // nil for a data plane
	DataPlane *DataPlane // nil for an all-in-one router
	Picker    *epp.Server
	GRPC      *grpc.Server
	Health    *health.Server

	workers func() []router.WorkerStatus
	log     *slog.Logger
	ready   atomic.Bool
}

// Health-check names besides epp.ServiceName and "" (the server as a
// whole), as the Endpoint Picker Protocol names them.
const (
	HealthLiveness  = "liveness"
	HealthReadiness = "readiness"
)

// eppMaxStreams bounds the ext_proc streams of one gateway connection
// (one per request in flight through that gateway).
const eppMaxStreams = 1 << 14

// NewEPP builds an endpoint picker from a config validated for
// config.RoleEPP. client is the control-plane client (remote mode only);
// paths are kept for SIGHUP reloads (all-in-one mode).
func NewEPP(cfg *config.Config, paths []string, log *slog.Logger, seed uint64, client *http.Client, opts ...Option) (*EPP, error) {
	e := &EPP{log: log}
	var handler http.Handler
	var m *metrics.Metrics
	var ms *http.Server
	var workerKey func(string) string
	if cfg.EPPBase() == config.RoleDataPlane {
		d, err := NewDataPlane(cfg, log, client, opts...)
		if err != nil {
			return nil, err
		}
		e.DataPlane, handler, m, ms, e.workers = d, d.HTTP.Handler, d.Metrics, d.MetricsHTTP, d.Router.Workers
		workerKey = func(w string) string { return d.Proxy.WorkerKey(w, d.Router.WorkerSource(w)) }
	} else {
		a, err := NewAllInOne(cfg, paths, log, seed, opts...)
		if err != nil {
			return nil, err
		}
		e.AllInOne, handler, m, ms, e.workers = a, a.HTTP.Handler, a.Metrics, a.MetricsHTTP, a.Router.Workers
		workerKey = a.workerKey
	}
	if ms != nil {
		ms.Handler = e.probes(ms.Handler)
	}
	e.Picker = epp.New(epp.Options{
		Handler:      handler,
		Workers:      e.workers,
		WorkerKey:    workerKey,
		Fallbacks:    cfg.EPP.FallbackEndpoints,
		MaxBodyBytes: cfg.Proxy.MaxBodyBytes,
		Metrics:      epp.NewMetrics(m.Registry),
		Logger:       log,
	})
	gopts := []grpc.ServerOption{
		grpc.MaxConcurrentStreams(eppMaxStreams),
		// Gateways keep their connection to the picker open and may ping
		// it; refusing pings would cost them the connection.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
	}
	if cfg.Server.TLS.Enabled() {
		tc, err := cfg.Server.TLS.ServerConfig()
		if err != nil {
			return nil, err
		}
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(tc)))
	}
	e.GRPC = grpc.NewServer(gopts...)
	extprocv3.RegisterExternalProcessorServer(e.GRPC, e.Picker)
	e.Health = health.NewServer()
	e.Health.SetServingStatus(HealthLiveness, healthpb.HealthCheckResponse_SERVING)
	e.setReady(false)
	healthpb.RegisterHealthServer(e.GRPC, e.Health)
	return e, nil
}

// probes adds GET /livez and /readyz to the metrics listener: the gRPC
// checks' answers over plain HTTP, for a kubelet that cannot run a gRPC
// probe against the ext_proc port (it speaks TLS to gateways, and the
// kubelet's gRPC probes do not).
func (e *EPP) probes(metrics http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", metrics)
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !e.ready.Load() {
			http.Error(w, "not ready: no worker known yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

// setReady sets readiness, the ext_proc service and the server as a whole.
func (e *EPP) setReady(ok bool) {
	e.ready.Store(ok)
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range []string{"", HealthReadiness, epp.ServiceName} {
		e.Health.SetServingStatus(name, st)
	}
}

// readiness keeps the readiness checks in step with the worker set: ready
// while the picker knows a worker to name (a gateway that fails open
// routes on its own meanwhile), every half second.
func (e *EPP) readiness(ctx context.Context) {
	ready := false
	check := func() {
		if ok := len(e.workers()) > 0; ok != ready {
			ready = ok
			e.setReady(ok)
			e.log.Info("endpoint picker readiness", "ready", ok)
		}
	}
	check()
	every.Tick(ctx, 500*time.Millisecond, nil, check)
}

// Run serves ext_proc and gRPC health on ln until ctx ends.
func (e *EPP) Run(ctx context.Context, ln net.Listener) error {
	srv := &grpcFront{s: e.GRPC, health: e.Health, picker: e.Picker}
	if e.DataPlane != nil {
		return e.DataPlane.serve(ctx, ln, srv, "cart endpoint picker listening (ext_proc, control plane)", e.readiness)
	}
	return e.AllInOne.serve(ctx, ln, func(*config.Config) httpServer { return srv }, "cart endpoint picker listening (ext_proc, all-in-one)", e.readiness)
}

// Reload is the all-in-one router's SIGHUP reload (a data plane learns
// its workers from the control plane).
func (e *EPP) Reload() error {
	if e.AllInOne == nil {
		return nil
	}
	return e.AllInOne.Reload()
}

// grpcFront serves the gRPC server where the proxy's HTTP server would be.
type grpcFront struct {
	s      *grpc.Server
	health *health.Server
	picker *epp.Server
}

func (g *grpcFront) Serve(ln net.Listener) error { return g.s.Serve(ln) }

// Shutdown says NOT_SERVING to every health check (gateways stop sending
// new requests), lets the streams in flight finish until ctx ends, then
// cuts the rest.
func (g *grpcFront) Shutdown(ctx context.Context) error {
	g.health.Shutdown()
	done := make(chan struct{})
	go func() { g.s.GracefulStop(); close(done) }()
	select {
	case <-done:
		g.picker.Wait()
		return nil
	case <-ctx.Done():
		g.s.Stop()
		<-done
		g.picker.Wait()
		return ctx.Err()
	}
}

func (g *grpcFront) Close() error {
	g.s.Stop()
	g.picker.Wait()
	return nil
}
