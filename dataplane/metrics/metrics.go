// Package metrics holds the Prometheus collectors the data plane exports.
// Every proxy instance registers its own set on its own registry, so tests
// can run many routers in one process.
package metrics

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics are the data plane's collectors.
type Metrics struct {
	Registry *prometheus.Registry

	Requests          *prometheus.CounterVec   // endpoint, status, worker, tenant
	Decisions         *prometheus.CounterVec   // reason
	MatchedRatio      prometheus.Histogram     //
	DecisionLatency   prometheus.Histogram     // seconds
	InFlight          *prometheus.GaugeVec     // worker
	Retries           *prometheus.CounterVec   // reason
	RetryBudgetExhaus prometheus.Counter       //
	BreakerState      *prometheus.GaugeVec     // worker, state (1 for the current state)
	BreakerTrans      *prometheus.CounterVec   // worker, to
	Healthy           *prometheus.GaugeVec     // worker
	IndexEntries      prometheus.GaugeFunc     //
	IndexEvictions    prometheus.CounterFunc   //
	IndexSkipped      prometheus.CounterFunc   //
	LoadUnderflows    prometheus.CounterFunc   //
	UpstreamTTFB      *prometheus.HistogramVec // worker
	PromptTokens      *prometheus.CounterVec   // worker
	CachedTokens      *prometheus.CounterVec   // worker
	PredictedCached   *prometheus.CounterVec   // worker: characters the index predicted as cached, in tokens
	CachedFraction    *prometheus.HistogramVec // kind=predicted|actual
	ClientDisconnects prometheus.Counter       //
	Fallbacks         *prometheus.CounterVec   // cause
	ModelsCache       *prometheus.CounterVec   // result=hit|miss|stale, or pool: the union of the workers' lists
	Reloads           *prometheus.CounterVec   // result=accepted|rejected
	PDDecisions       *prometheus.CounterVec   // outcome=split|short_prompt|no_prefill|no_decode
	PDLegs            *prometheus.HistogramVec // leg=prefill|handoff|decode_first_byte
}

// IndexSource reports index counters at scrape time.
type IndexSource func() (entries int, evicted, skipped, underflows uint64)

// New registers all collectors on a fresh registry. idx may be nil (data
// planes without a local index).
func New(idx IndexSource) *Metrics {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	f := func(c prometheus.Collector) { r.MustRegister(c) }
	latencyBuckets := []float64{1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1}
	m := &Metrics{Registry: r}
	m.Requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_requests_total", Help: "Requests served, by endpoint, final status class (1xx-5xx; 499 for clients that hung up), worker and tenant (client key name, or anonymous)."}, []string{"endpoint", "status", "worker", "tenant"})
	m.Decisions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_routing_decisions_total", Help: "Routing decisions by reason."}, []string{"reason"})
	m.MatchedRatio = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "cart_routing_matched_ratio", Help: "Fraction of the key text matched in the prefix index.", Buckets: prometheus.LinearBuckets(0, 0.1, 11)})
	m.DecisionLatency = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "cart_routing_decision_seconds", Help: "Time to decide a route.", Buckets: latencyBuckets})
	m.InFlight = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "cart_worker_in_flight", Help: "Requests in flight per worker."}, []string{"worker"})
	m.Retries = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_retries_total", Help: "Retried upstream attempts, by cause."}, []string{"cause"})
	m.RetryBudgetExhaus = prometheus.NewCounter(prometheus.CounterOpts{Name: "cart_retry_budget_exhausted_total", Help: "Retries not attempted because the retry budget was spent."})
	m.BreakerState = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "cart_circuit_breaker_state", Help: "1 for the current breaker state of each worker."}, []string{"worker", "state"})
	m.BreakerTrans = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_circuit_breaker_transitions_total", Help: "Breaker state changes, by worker and new state."}, []string{"worker", "to"})
	m.Healthy = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "cart_worker_healthy", Help: "1 when the worker passes health checks."}, []string{"worker"})
	m.UpstreamTTFB = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "cart_upstream_ttfb_seconds", Help: "Time from dispatch to upstream response headers.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)}, []string{"worker"})
	m.PromptTokens = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_prompt_tokens_total", Help: "Prompt tokens reported by workers, for responses whose usage says how many were cached (reports without cache fields are left out)."}, []string{"worker"})
	m.CachedTokens = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_cached_tokens_total", Help: "Cached prompt tokens reported by workers (usage.prompt_tokens_details.cached_tokens, Anthropic cache_read_input_tokens); reports without these fields are unknown and left out."}, []string{"worker"})
	m.PredictedCached = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_predicted_cached_tokens_total", Help: "Prompt tokens the index predicted cached on the chosen worker (characters/4), for responses whose usage reported cached tokens."}, []string{"worker"})
	m.CachedFraction = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "cart_cached_fraction", Help: "Per request cached fraction of the prompt: predicted by the index vs reported by the worker (responses with cache fields only).", Buckets: prometheus.LinearBuckets(0, 0.1, 11)}, []string{"kind"})
	m.ClientDisconnects = prometheus.NewCounter(prometheus.CounterOpts{Name: "cart_client_disconnects_total", Help: "Requests abandoned by the client (logged as 499)."})
	m.Fallbacks = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_fallback_total", Help: "Requests routed locally because the control plane could not decide, by cause."}, []string{"cause"})
	m.ModelsCache = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_models_cache_total", Help: "GET /v1/models answers by source."}, []string{"result"})
	m.Reloads = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_config_reloads_total", Help: "SIGHUP reloads by result."}, []string{"result"})
	m.PDDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_pd_decisions_total",
		Help: "Decisions for requests that could be split between a prefill and a decode worker, by outcome: split, or whole because of short_prompt (disaggregation.threshold_tokens), no_prefill or no_decode (no worker of that role could take it)."}, []string{"outcome"})
	m.PDLegs = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "cart_pd_leg_seconds",
		Help:    "Split requests' legs as CART sees them: prefill (the prefill leg, sent to answer read), handoff (answer read to decode leg sent), decode_first_byte (decode leg sent to its first body byte: includes the KV transfer, which the decode engine completes before its first token).",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}, []string{"leg"})
	for _, c := range []prometheus.Collector{m.Requests, m.Decisions, m.MatchedRatio, m.DecisionLatency, m.InFlight, m.Retries, m.RetryBudgetExhaus, m.BreakerState, m.BreakerTrans, m.Healthy, m.UpstreamTTFB, m.PromptTokens, m.CachedTokens, m.PredictedCached, m.CachedFraction, m.ClientDisconnects, m.Fallbacks, m.ModelsCache, m.Reloads, m.PDDecisions, m.PDLegs} {
		f(c)
	}
	if idx != nil {
		m.IndexEntries = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "cart_index_entries", Help: "Entries in the prefix index."}, func() float64 { e, _, _, _ := idx(); return float64(e) })
		m.IndexEvictions = prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "cart_index_evictions_total", Help: "Prefix index entries evicted (LRU, expiry, daily reset)."}, func() float64 { _, e, _, _ := idx(); return float64(e) })
		m.IndexSkipped = prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "cart_index_skipped_inserts_total", Help: "Prefix index inserts skipped because the index was full between eviction passes."}, func() float64 { _, _, s, _ := idx(); return float64(s) })
		m.LoadUnderflows = prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "cart_load_release_underflows_total", Help: "Load releases with no load outstanding (absorbed; should stay 0)."}, func() float64 { _, _, _, u := idx(); return float64(u) })
		f(m.IndexEntries)
		f(m.IndexEvictions)
		f(m.IndexSkipped)
		f(m.LoadUnderflows)
	}
	return m
}

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

// SetBreaker records w's breaker state as a one-hot gauge.
func (m *Metrics) SetBreaker(w, state string) {
	for _, s := range []string{"closed", "open", "half_open"} {
		v := 0.0
		if s == state {
			v = 1
		}
		m.BreakerState.WithLabelValues(w, s).Set(v)
	}
}

// SetHealthy records w's health verdict.
func (m *Metrics) SetHealthy(w string, healthy bool) {
	v := 0.0
	if healthy {
		v = 1
	}
	m.Healthy.WithLabelValues(w).Set(v)
}
