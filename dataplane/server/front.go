package server

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/models"
	"github.com/cartrouter/cart/dataplane/breaker"
	"github.com/cartrouter/cart/dataplane/metrics"
	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/dataplane/router"
	"github.com/cartrouter/cart/internal/tracing"
)

// The all-in-one router and the data plane differ only in their router;
// what stands in front of it, and how it is served, is built here once.

// newFront builds the proxy over rt, the HTTP server that serves it and
// the metrics server (nil when server.metrics_addr is unset).
func newFront(cfg *config.Config, rt router.Router, br *breaker.Set, m *metrics.Metrics, reg *models.Registry,
	tr *tracing.Tracer, log *slog.Logger) (*proxy.Proxy, *http.Server, *http.Server, error) {
	po := ProxyOptions(cfg, router.Traced(tr, rt), br, m, log)
	po.Models, po.Tracer = reg, tr
	if err := applyAuth(&po, cfg); err != nil {
		return nil, nil, nil, err
	}
	p := proxy.New(po)
	srv, err := HTTPServer(cfg, tr.Handler(p), log)
	if err != nil {
		return nil, nil, nil, err
	}
	return p, srv, MetricsServer(cfg, m, log), nil
}

// openMetrics checks that ln may be served under cfg and opens the metrics
// listener (nil without a metrics server). When either fails it closes ln,
// so that Run can return at once.
func openMetrics(cfg *config.Config, ln net.Listener, metricsSrv *http.Server, log *slog.Logger) (net.Listener, error) {
	if err := CheckExposure(cfg, ln.Addr(), log); err != nil {
		_ = ln.Close()
		return nil, err
	}
	mln, err := listenMetrics(metricsSrv)
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	return mln, nil
}

// serveAlongside serves srv on ln until ctx ends, with the metrics server
// on mln and each of tasks running beside it, and returns once all of them
// have stopped.
func serveAlongside(ctx context.Context, srv *http.Server, ln net.Listener, grace time.Duration,
	metricsSrv *http.Server, mln net.Listener, log *slog.Logger, tasks ...func(context.Context)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	run := func(task func(context.Context)) {
		wg.Add(1)
		go func() { defer wg.Done(); task(ctx) }()
	}
	run(func(ctx context.Context) { serveMetrics(ctx, metricsSrv, mln, log) })
	for _, task := range tasks {
		run(task)
	}
	err := Serve(ctx, srv, ln, grace)
	cancel()
	wg.Wait()
	return err
}
