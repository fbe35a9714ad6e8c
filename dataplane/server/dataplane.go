package server

import (
	"context"
	"fmt"
	"github.com/cartrouter/cart/controlplane/decider"
	"log/slog"
	"net"
	"net/http"
	"os"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/models"
	"github.com/cartrouter/cart/dataplane/breaker"
	"github.com/cartrouter/cart/dataplane/metrics"
	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/dataplane/remote"
	"github.com/cartrouter/cart/dataplane/router"
	"github.com/cartrouter/cart/internal/tracing"
)

// DataPlane is a stateless proxy that asks the control plane where each
// request goes. It shares every line of proxy code with the all-in-one
// mode; only its Router differs.
type DataPlane struct {
	cfg     *config.Config
	log     *slog.Logger
	Router  *remote.Router
	Break   *breaker.Set
	Metrics *metrics.Metrics
	Proxy   *proxy.Proxy
	HTTP    *http.Server
	// MetricsHTTP serves /metrics on server.metrics_addr; nil when unset.
	MetricsHTTP *http.Server

	// Models is which models each worker serves, as the control plane
	// reports them (the configured declarations until the first sync).
	Models *models.Registry

	// Tracer traces requests (nil: off); ownTracer: Run shuts it down.
	Tracer    *tracing.Tracer
	ownTracer bool
}

// DataPlaneID returns the configured id or hostname-pid.
func DataPlaneID(cfg *config.Config) string {
	if cfg.DataPlane.ID != "" {
		return cfg.DataPlane.ID
	}
	host, err := os.Hostname()
	if err != nil {
		host = "dataplane"
	}
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}

// NewDataPlane builds a data plane from a validated config.
func NewDataPlane(cfg *config.Config, log *slog.Logger, client *http.Client, opts ...Option) (_ *DataPlane, err error) {
	token, _, err := cfg.Tokens()
	if err != nil {
		return nil, err
	}
	d := &DataPlane{cfg: cfg, log: log}
	if d.Tracer, d.ownTracer, err = tracing.ForRole(cfg, config.RoleDataPlane, DataPlaneID(cfg), opts, log); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil && d.ownTracer {
			_ = d.Tracer.Close()
		}
	}()
	d.Metrics = metrics.New(nil)
	boot := make([]router.WorkerStatus, len(cfg.Workers))
	for i, w := range cfg.Workers {
		boot[i] = router.WorkerStatus{URL: w.URL, MaxLoad: w.MaxLoad, LoadPenalty: w.LoadPenalty, Healthy: true, Source: config.SourceStatic}
	}
	d.Models = models.New()
	d.Models.SetWorkers(ModelWorkers(cfg.Workers))
	d.Router = remote.New(remote.Options{
		Models:        d.Models,
		ID:            DataPlaneID(cfg),
		ControlPlanes: cfg.DataPlane.ControlPlane,
		RouteTimeout:  millis(cfg.DataPlane.RouteTimeoutMs),
		SyncInterval:  millis(cfg.DataPlane.WorkerSyncIntervalMs),
		FlushInterval: millis(cfg.DataPlane.ReportIntervalMs),
		Token:         token,
		HTTPClient:    client,
		BootWorkers:   boot,
		BlockChars:    cfg.Cache.BlockChars,
		Logger:        log,
		OnFallback: func(cause string) {
			d.Metrics.Fallbacks.WithLabelValues(cause).Inc()
		},
		OnHealthy: func(url string) { d.Break.HealthRecovered(url) },
		Shadow: remote.ShadowOptions{Entries: remote.DefaultShadowEntries, Threshold: cfg.Cache.Threshold, MatchAbsChars: cfg.Cache.MatchAbsThreshold,
			BalanceAbs: cfg.Cache.BalanceAbsThreshold, BalanceRel: cfg.Cache.BalanceRelThreshold},
		RouteBreakerFailures:   cfg.DataPlane.RouteBreakerFailures,
		RouteBreakerCooloff:    cfg.DataPlane.RouteBreakerCooloff(),
		Interceptors:           d.Tracer.Interceptors(),
		RouteStream:            cfg.DataPlane.RouteStream,
		RouteStreamMaxInFlight: cfg.DataPlane.RouteStreamMaxInFlight,
		PlacementFeed:          cfg.DataPlane.RouteStreamPlacementFeed,
		Flow:                   RemoteFlow(cfg),
	})
	d.Metrics.Registry.MustRegister(d.Router.Collectors()...)
	d.Break = breaker.NewSet(BreakerConfig(cfg), func(t breaker.Transition) {
		d.Metrics.SetBreaker(t.Worker, t.To.String())
		d.Metrics.BreakerTrans.WithLabelValues(t.Worker, t.To.String()).Inc()
		log.Warn("circuit breaker", "worker", t.Worker, "from", t.From.String(), "to", t.To.String())
	})
	if d.Proxy, d.HTTP, d.MetricsHTTP, err = newFront(cfg, d.Router, d.Break, d.Metrics, d.Models, d.Tracer, log); err != nil {
		return nil, err
	}
	return d, nil
}

// Run serves on ln until ctx ends, syncing with the control plane.
func (d *DataPlane) Run(ctx context.Context, ln net.Listener) error {
	if d.ownTracer {
		defer closeTracer(d.Tracer, d.log)
	}
	mln, err := openMetrics(d.cfg, ln, d.MetricsHTTP, d.log)
	if err != nil {
		return err
	}
	d.log.Info("cart data plane listening", "addr", ln.Addr().String(), "control_plane", d.cfg.DataPlane.ControlPlane)
	return serveAlongside(ctx, d.HTTP, ln, config.Seconds(d.cfg.Server.ShutdownGraceSecs), d.MetricsHTTP, mln, d.log, d.Router.Run)
}

// RemoteFlow translates flow.* for the data plane's side of flow control.
func RemoteFlow(cfg *config.Config) remote.FlowOptions {
	f := decider.FlowFrom(cfg)
	return remote.FlowOptions{On: !f.Off, Limits: f.Limits, QueueTimeout: f.QueueTimeout, RetryAfter: f.RetryAfter}
}
