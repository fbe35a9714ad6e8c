package decider

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cartrouter/cart/config"
)

// flowMetrics are flow control's counters; the queue's depth and the
// pool's saturation are read at scrape time (flowCollector).
type flowMetrics struct {
	enqueued, cancelled prometheus.Counter
	refusedVec          *prometheus.CounterVec
	dispatchedVec       *prometheus.CounterVec
	wait                *prometheus.HistogramVec
}

// WaitBuckets span 1 ms to 2 minutes: a queued request waits for a
// sequence to finish (tens to hundreds of ms) up to the queue timeout.
var WaitBuckets = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}

func (m *flowMetrics) init() {
	m.enqueued = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "cart_flow_enqueued_total",
		Help: "Requests that found every eligible worker saturated and waited in the queue.",
	})
	m.cancelled = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "cart_flow_cancelled_total",
		Help: "Queued requests whose client went away (or whose data plane stopped waiting) before a worker took them.",
	})
	m.refusedVec = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cart_flow_refused_total",
		Help: "Requests flow control answered 429, by reason: shed (sheddable priority, pool saturated), timeout (waited queue_timeout), queue_full, tenant_full.",
	}, []string{"reason"})
	for _, r := range []string{RefusedShed, RefusedTimeout, RefusedQueueFull, RefusedTenantFull} {
		m.refusedVec.WithLabelValues(r)
	}
	m.dispatchedVec = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cart_flow_dispatched_total",
		Help: "Queued requests bound to a worker, by priority.",
	}, []string{"priority"})
	m.wait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "cart_flow_wait_seconds",
		Help:    "How long queued requests waited for a worker, by priority and tenant (client key name).",
		Buckets: WaitBuckets,
	}, []string{"priority", "tenant"})
	// The default priority's series exist from the start, so a dashboard
	// shows zero rather than no data before the first wait.
	m.dispatchedVec.WithLabelValues("0")
	m.wait.WithLabelValues("0", config.AnonymousTenant)
}

func (m *flowMetrics) refused(reason string) { m.refusedVec.WithLabelValues(reason).Inc() }

func (m *flowMetrics) dispatched(a Admission, waited time.Duration) {
	p := strconv.Itoa(a.Priority)
	m.dispatchedVec.WithLabelValues(p).Inc()
	m.wait.WithLabelValues(p, a.Label).Observe(waited.Seconds())
}

// flowCollector exports the queue's depth per (priority, tenant) and the
// pool's saturation, read in one lock hold at scrape time.
type flowCollector struct {
	d                             *Decider
	total, depth, bytes, pool, sl *prometheus.Desc
}

func (c *flowCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.total
	ch <- c.depth
	ch <- c.bytes
	ch <- c.pool
	ch <- c.sl
}

func (c *flowCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.d.Queue()
	type key struct {
		prio   int
		tenant string
	}
	depth := map[key]int{}
	for _, it := range s.Items {
		depth[key{it.Priority, it.Label}]++
	}
	ch <- prometheus.MustNewConstMetric(c.total, prometheus.GaugeValue, float64(len(s.Items)))
	for k, n := range depth {
		ch <- prometheus.MustNewConstMetric(c.depth, prometheus.GaugeValue, float64(n), strconv.Itoa(k.prio), k.tenant)
	}
	ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(s.Bytes))
	p := c.d.PoolSaturation()
	ch <- prometheus.MustNewConstMetric(c.pool, prometheus.GaugeValue, p.Demand)
	ch <- prometheus.MustNewConstMetric(c.sl, prometheus.GaugeValue, float64(p.Slots))
}

// PoolLoad is the pool's demand against its known capacity.
type PoolLoad struct {
	// Slots is the sum of the limits of healthy workers that have one.
	Slots int
	// Demand is (in flight + queued) / Slots: above 1 the pool is
	// saturated and requests wait; 0 when no worker's limit is known.
	Demand float64
	Queued int
}

// PoolSaturation reads the pool's demand against its capacity.
func (d *Decider) PoolSaturation() PoolLoad {
	t := d.lock()
	defer d.unlock(OpRead, t)
	var p PoolLoad
	inflight := 0
	for _, w := range d.eng.Workers() {
		lim := w.MaxLoad
		if c, _ := d.eng.Concurrency(w.URL); c > 0 && (lim == 0 || c < lim) {
			lim = c
		}
		if !w.Healthy || w.Draining || lim == 0 {
			continue
		}
		p.Slots += lim
		inflight += w.Load
	}
	if d.fq != nil {
		p.Queued = d.fq.Len()
	}
	if p.Slots > 0 {
		p.Demand = float64(inflight+p.Queued) / float64(p.Slots)
	}
	return p
}

func (m *flowMetrics) collectors(d *Decider) []prometheus.Collector {
	return []prometheus.Collector{m.enqueued, m.cancelled, m.refusedVec, m.dispatchedVec, m.wait, &flowCollector{
		d:     d,
		total: prometheus.NewDesc("cart_flow_queued", "Requests waiting for a worker in the flow-control queue.", nil, nil),
		depth: prometheus.NewDesc("cart_flow_queue_depth", "Requests waiting for a worker, by priority and tenant (client key name).",
			[]string{"priority", "tenant"}, nil),
		bytes: prometheus.NewDesc("cart_flow_queue_bytes", "Body bytes of the requests waiting for a worker.", nil, nil),
		pool: prometheus.NewDesc("cart_pool_saturation",
			"Requests in flight plus queued over the pool's known slots (the limits of healthy workers that have one): above 1 requests wait; a signal for an autoscaler. 0 while no worker's limit is known.", nil, nil),
		sl: prometheus.NewDesc("cart_pool_slots", "The pool's known slots: the sum of healthy workers' limits (max_load, max_concurrency or learned).", nil, nil),
	}}
}
