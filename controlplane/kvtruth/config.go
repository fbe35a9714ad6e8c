package kvtruth

import (
	"log/slog"
	"time"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/kvevents/zmtpguard"
)

// SourcesFrom lists the workers whose engines' KV events are consumed. It
// lives here, not beside its callers, because both the control-plane daemon
// and the all-in-one router need it and the control plane never imports the
// data plane.
func SourcesFrom(cfg *config.Config) []Source {
	var out []Source
	for _, w := range cfg.Workers {
		e := w.KVEvents
		if !e.On() {
			continue
		}
		out = append(out, Source{Worker: w.URL, Endpoint: e.Endpoint, ReplayEndpoint: e.ReplayEndpoint,
			Topic: e.Topic, DataParallelSize: e.DataParallelSize})
	}
	return out
}

// OptionsFrom translates kv_events.* and workers[].kv_events into Options;
// the caller supplies the applier. The config is validated: a key that
// does not parse here was refused at startup.
func OptionsFrom(cfg *config.Config, app Applier, m *Metrics, log *slog.Logger) Options {
	k := cfg.KVEvents
	allow, _ := k.Publishers()
	mode, _ := k.SocketMode()
	return Options{Sources: SourcesFrom(cfg), Listen: k.Listen, BlockChars: cfg.Cache.BlockChars,
		ReplayTimeout:    time.Duration(k.ReplayTimeoutMs) * time.Millisecond,
		MaxHashesPerRank: k.MaxHashesPerRank,
		Guard: zmtpguard.Limits{MaxMessageBytes: k.MaxMessageBytes, MaxConns: k.MaxPublisherConnections,
			Allow: allow, IPCMode: mode},
		Applier: app, Metrics: m, Logger: log}
}
