package sim

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics exposes a replica's state in Prometheus text format. Each Server has
// its own registry so that many in-process replicas never collide on the
// global default registry.
type metrics struct {
	registry *prometheus.Registry
	requests *prometheus.CounterVec
	handler  http.Handler
}

// newMetrics registers the replica's metrics. Token counters and gauges read
// the Server's own atomics at scrape time, so /metrics, /sim/stats and Stats
// can never disagree; Reset makes those counters drop to zero, which
// Prometheus's rate() treats like a process restart.
func newMetrics(s *Server) *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sim_requests_total",
			Help: "Inference API requests by endpoint and outcome (HTTP status; 499 when the client went away, aborted when the replica cut the connection).",
		}, []string{"endpoint", "status"}),
	}
	// vLLM's name for the time a request spent in the engine's waiting
	// queue; the buckets start at a millisecond because a router that
	// queues in front of the engine should keep nearly every wait at 0.
	queueTime := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:        "vllm:request_queue_time_seconds",
		Help:        "Histogram of time spent in WAITING phase for request.",
		ConstLabels: prometheus.Labels{"model_name": s.cfg.Model},
		Buckets:     []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
	})
	s.seqs.waited = func(d time.Duration) { queueTime.Observe(d.Seconds()) }
	m.registry.MustRegister(
		m.requests,
		queueTime,
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sim_prompt_tokens_total",
			Help: "Prompt tokens of requests whose prefill completed.",
		}, func() float64 { return float64(s.promptTokens.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sim_cached_tokens_total",
			Help: "Prompt tokens served from the prefix cache.",
		}, func() float64 { return float64(s.cachedTokens.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sim_generation_tokens_total",
			Help: "Output tokens generated.",
		}, func() float64 { return float64(s.completionTokens.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sim_running_requests",
			Help: "Requests admitted past the prefill queue and not yet finished.",
		}, func() float64 { return float64(s.running.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sim_queue_depth",
			Help: "Requests waiting for a prefill slot.",
		}, func() float64 { return float64(s.queued.Load()) }),
		// vLLM's own names (llm-d-inference-sim exports them too), which
		// routers read to see a replica's batch and queue.
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "vllm:num_requests_running",
			Help:        "Number of requests in model execution batches.",
			ConstLabels: prometheus.Labels{"model_name": s.cfg.Model},
		}, func() float64 { r, _ := s.seqs.counts(); return float64(r) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "vllm:num_requests_waiting",
			Help:        "Number of requests waiting to be processed.",
			ConstLabels: prometheus.Labels{"model_name": s.cfg.Model},
		}, func() float64 { _, w := s.seqs.counts(); return float64(w) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "vllm:kv_cache_usage_perc",
			Help:        "KV-cache usage. 1 means 100 percent usage.",
			ConstLabels: prometheus.Labels{"model_name": s.cfg.Model},
		}, func() float64 { return s.cache.usage() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sim_cache_blocks",
			Help: "Blocks held by the prefix cache.",
		}, func() float64 { return float64(s.cache.len()) }),
	)
	if s.pd != nil {
		m.registry.MustRegister(s.pd.collectors()...)
	}
	m.handler = promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{
		// A scrape should show whatever it can rather than fail whole.
		ErrorHandling: promhttp.ContinueOnError,
	})
	return m
}
