package server

import (
	"log/slog"
	"reflect"
	"time"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/kvtruth"
)

// KVSources lists the workers whose engines' KV events are consumed.
func KVSources(cfg *config.Config) []kvtruth.Source {
	var out []kvtruth.Source
	for _, w := range cfg.Workers {
		e := w.KVEvents
		if !e.On() {
			continue
		}
		out = append(out, kvtruth.Source{Worker: w.URL, Endpoint: e.Endpoint, ReplayEndpoint: e.ReplayEndpoint,
			Topic: e.Topic, DataParallelSize: e.DataParallelSize})
	}
	return out
}

// KVOptions translates kv_events.* and workers[].kv_events for kvtruth;
// the caller supplies the applier.
func KVOptions(cfg *config.Config, app kvtruth.Applier, m *kvtruth.Metrics, log *slog.Logger) kvtruth.Options {
	return kvtruth.Options{Sources: KVSources(cfg), Listen: cfg.KVEvents.Listen, BlockChars: cfg.Cache.BlockChars,
		ReplayTimeout: time.Duration(cfg.KVEvents.ReplayTimeoutMs) * time.Millisecond,
		Applier:       app, Metrics: m, Logger: log}
}

// kvEventsChanged reports whether a reload would change which engines' KV
// events are consumed: they are read at start, so such a reload is
// refused (kv_events.* itself is not a worker key and is refused anyway).
func kvEventsChanged(a, b *config.Config) bool {
	return !reflect.DeepEqual(KVSources(a), KVSources(b))
}
