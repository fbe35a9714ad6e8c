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
	"github.com/cartrouter/cart/dataplane/breaker"
	"github.com/cartrouter/cart/dataplane/extract"
	"github.com/cartrouter/cart/dataplane/metrics"
	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/dataplane/router"
)

func millis(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// ProxyOptions translates configuration into proxy options.
func ProxyOptions(cfg *config.Config, r router.Router, b *breaker.Set, m *metrics.Metrics, log *slog.Logger) proxy.Options {
	p := cfg.Proxy
	return proxy.Options{
		Router:              r,
		Breakers:            b,
		Metrics:             m,
		Logger:              log,
		BlockChars:          cfg.Cache.BlockChars,
		MaxBodyBytes:        p.MaxBodyBytes,
		AddRoutedPeerHeader: p.AddRoutedPeerHeader,
		RemoteMediaPolicy:   p.RemoteMediaURLPolicy,
		AllowFileMediaURLs:  p.RemoteMediaAllowFile,
		PassThroughPaths:    p.PassThroughPaths,
		// Only the built-in inference APIs are resent after a failure:
		// an operator-added path may have side effects.
		RetryablePassThroughPaths: config.DefaultPassThroughPaths,
		ConnectTimeout:            config.Seconds(p.ConnectTimeoutSecs),
		RequestTimeout:            config.Seconds(p.RequestTimeoutSecs),
		StreamIdleTimeout:         config.Seconds(p.StreamIdleTimeoutSecs),
		MaxRetries:                p.MaxRetries,
		InitialBackoff:            millis(p.InitialBackoffMs),
		MaxBackoff:                millis(p.MaxBackoffMs),
		BackoffMultiplier:         p.BackoffMultiplier,
		JitterFactor:              p.JitterFactor,
		RetryableStatuses:         p.RetryableStatuses,
		RetryBudgetRatio:          p.RetryBudgetRatio,
		RetryBudgetMin:            p.RetryBudgetMin,
		ModelsCacheTTL:            config.Seconds(p.ModelsCacheSecs),
		SessionKeys:               sessionKeys(cfg),
		ResponseAffinityTTL:       cfg.Responses.AffinityTTL(),
		ResponseAffinityMax:       cfg.Responses.MaxEntries,
		Extract:                   extract.Options{IgnoreSystemPrefixes: cfg.Extract.IgnoreSystemPrefixes},

		BodyReadTimeout:      config.Seconds(p.BodyReadTimeoutSecs),
		MaxInflightBodyBytes: p.MaxInflightBodyBytes,
		MaxItems:             p.MaxMessages,
		Flow:                 FlowPolicy(cfg),
		Disagg:               DisaggOptions(cfg),
	}
}

// DisaggOptions translates disaggregation.* (validated: every endpoint
// name is known).
func DisaggOptions(cfg *config.Config) proxy.DisaggOptions {
	d := cfg.Disaggregation
	o := proxy.DisaggOptions{Sidecar: d.Mode == "sidecar"}
	for _, name := range d.Endpoints {
		if ep, ok := extract.EndpointForName(name); ok {
			o.Endpoints = append(o.Endpoints, ep)
		}
	}
	return o
}

// FlowPolicy translates flow.* and the client keys' priority settings.
func FlowPolicy(cfg *config.Config) proxy.FlowPolicy {
	f := cfg.Flow
	fp := proxy.FlowPolicy{PriorityHeaders: f.PriorityHeaders, TenantHeader: f.TenantHeader, DeadlineHeader: f.DeadlineHeader, EnginePriority: f.EnginePriority,
		Keys: map[string]proxy.TenantFlow{}, Default: proxy.TenantFlow{Weight: 1}}
	for _, k := range cfg.Auth.ClientKeys {
		tf := proxy.TenantFlow{Priority: k.Priority, MaxPriority: k.Priority, Weight: k.Weight}
		if k.MaxPriority != nil {
			tf.MaxPriority = *k.MaxPriority
		}
		if tf.Weight <= 0 {
			tf.Weight = 1
		}
		fp.Keys[k.Name] = tf
	}
	return fp
}

func sessionKeys(cfg *config.Config) []string {
	if !cfg.Session.Enabled {
		return nil
	}
	return cfg.Session.Keys
}

// BreakerConfig translates circuit_breaker.*.
func BreakerConfig(cfg *config.Config) breaker.Config {
	cb := cfg.CircuitBreaker
	return breaker.Config{Enabled: cb.Enabled, FailureThreshold: cb.FailureThreshold, SuccessThreshold: cb.SuccessThreshold, Timeout: config.Seconds(cb.TimeoutSecs)}
}

// HTTPServer builds the client-facing server with the slowloris and size
// limits from server.*.
func HTTPServer(cfg *config.Config, h http.Handler, log *slog.Logger) (*http.Server, error) {
	s := cfg.Server
	srv := &http.Server{
		Addr:              net.JoinHostPort(s.Host, fmt.Sprint(s.Port)),
		Handler:           h,
		ReadHeaderTimeout: config.Seconds(s.ReadHeaderTimeoutSecs),
		IdleTimeout:       config.Seconds(s.IdleTimeoutSecs),
		MaxHeaderBytes:    s.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetHTTP2(true)
	protos.SetUnencryptedHTTP2(true) // h2c with prior knowledge, for HTTP/2 clients inside a cluster
	srv.Protocols = &protos
	if s.TLS.Enabled() {
		tc, err := s.TLS.ServerConfig()
		if err != nil {
			return nil, err
		}
		srv.TLSConfig = tc
	}
	return srv, nil
}

// Serve runs srv on ln until ctx ends, then shuts down gracefully: new
// connections stop, in-flight requests (streams included) get grace to
// finish. It serves TLS when srv has a TLS config.
func Serve(ctx context.Context, srv *http.Server, ln net.Listener, grace time.Duration) error {
	return serveUntil(ctx, stdServer{srv}, ln, grace)
}

// httpServer is what serves a client listener: net/http's server, or an
// endpoint picker's gRPC server.
type httpServer interface {
	Serve(net.Listener) error
	Shutdown(context.Context) error
	Close() error
}

// stdServer is net/http's server, with TLS when configured.
type stdServer struct{ *http.Server }

func (s stdServer) Serve(ln net.Listener) error {
	if s.TLSConfig != nil {
		return s.ServeTLS(ln, "", "")
	}
	return s.Server.Serve(ln)
}

func serveUntil(ctx context.Context, srv httpServer, ln net.Listener, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	err := srv.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = srv.Close()
	}
	<-errc
	return err
}
