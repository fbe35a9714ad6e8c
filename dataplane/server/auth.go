package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/dataplane/metrics"
	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/internal/credential"
)

// applyAuth puts the credentials of cfg into o: client keys, the admin
// token (guards /workers) and the keys workers expect.
func applyAuth(o *proxy.Options, cfg *config.Config) error {
	keys, err := cfg.ClientKeys()
	if err != nil {
		return err
	}
	_, admin, err := cfg.Tokens()
	if err != nil {
		return err
	}
	wk, err := WorkerKeys(cfg)
	if err != nil {
		return err
	}
	o.ClientKeys = make([]proxy.ClientKey, len(keys))
	for i, k := range keys {
		o.ClientKeys[i] = proxy.ClientKey{Name: k.Name, Key: k.Key, IsolateCache: k.IsolateCache}
	}
	o.AdminToken = admin
	o.WorkerKeys = wk
	o.MetricsElsewhere = cfg.Server.MetricsAddr != ""
	return nil
}

// WorkerKeys resolves workers[].api_key_file and proxy.worker_api_key_file,
// with the sources the pool key may go to.
func WorkerKeys(cfg *config.Config) (proxy.WorkerKeys, error) { return cfg.WorkerKeys() }

// ErrUnauthenticatedRemote is returned by CheckExposure.
var ErrUnauthenticatedRemote = errors.New("refusing to serve without client authentication on a non-loopback address")

// CheckExposure refuses to run a proxy listener bound to a non-loopback
// address without client keys: anyone who can reach the port could spend
// the pool's GPUs and read its models. It checks the address actually bound,
// not the configured host, because that is what the network sees.
func CheckExposure(cfg *config.Config, addr net.Addr, log *slog.Logger) error {
	if len(cfg.Auth.ClientKeys) > 0 || credential.IsLoopback(addr.String()) {
		return nil
	}
	if cfg.Auth.AllowUnauthenticatedRemote {
		log.Warn("serving without client authentication on a non-loopback address (auth.allow_unauthenticated_remote: true)", "addr", addr.String())
		return nil
	}
	return fmt.Errorf("%w (%s): set auth.client_keys, bind server.host to 127.0.0.1, or set auth.allow_unauthenticated_remote: true", ErrUnauthenticatedRemote, addr)
}

// MetricsServer builds the /metrics-only listener of server.metrics_addr,
// or returns nil when /metrics stays on the client listener.
func MetricsServer(cfg *config.Config, m *metrics.Metrics, log *slog.Logger) *http.Server {
	if cfg.Server.MetricsAddr == "" {
		return nil
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	return &http.Server{
		Addr:              cfg.Server.MetricsAddr,
		Handler:           mux,
		ReadHeaderTimeout: config.Seconds(cfg.Server.ReadHeaderTimeoutSecs),
		IdleTimeout:       config.Seconds(cfg.Server.IdleTimeoutSecs),
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
}

// listenMetrics opens the metrics listener, if any, before anything starts,
// so a port clash fails the start instead of silently losing metrics.
func listenMetrics(srv *http.Server) (net.Listener, error) {
	if srv == nil {
		return nil, nil
	}
	ln, err := net.Listen("tcp", srv.Addr)
	if err != nil {
		return nil, fmt.Errorf("listen server.metrics_addr: %w", err)
	}
	return ln, nil
}

// serveMetrics runs the metrics listener until ctx ends.
func serveMetrics(ctx context.Context, srv *http.Server, ln net.Listener, log *slog.Logger) {
	if srv == nil {
		return
	}
	log.Info("metrics listening", "addr", ln.Addr().String())
	if err := Serve(ctx, srv, ln, time.Second); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("metrics listener", "error", err.Error())
	}
}
