package service

import (
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/index"
)

// cpMetrics are the control plane's collectors. Raft and state gauges are
// read at scrape time, so they cannot go stale.
type cpMetrics struct {
	reg       *prometheus.Registry
	routes    *prometheus.CounterVec
	routeTime prometheus.Histogram
	// forwarded counts calls this node passed on to the leader.
	forwarded *prometheus.CounterVec
	// streams counts open RouterService.Stream calls (leader only).
	streams prometheus.Gauge
	// feedSent and feedSkipped count the placement feed's placements.
	feedSent, feedSkipped prometheus.Counter
	// syncBytes is the encoded size of the last Sync answer built.
	syncBytes prometheus.Gauge
	// streamMessages and streamItems count the Route streams' messages
	// and what they carried (calls in, answers and feed frames out): the
	// leader's cost per route is mostly per message, so items per message
	// is how much batching saves.
	streamMessages, streamItems *prometheus.CounterVec
}

func newCPMetrics(c *Core) *cpMetrics {
	m := &cpMetrics{reg: prometheus.NewRegistry()}
	// The scheduler's metrics add go_sched_latencies_seconds: how long
	// goroutines waited to run. A node short of CPU shows there before
	// its Route answers miss the data planes' deadline.
	m.reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsScheduler)),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.routes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_cp_routes_total", Help: "Route decisions made by this node as leader, by reason."}, []string{"reason"})
	m.routeTime = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "cart_cp_route_seconds", Help: "Leader-side Route decision time.",
		Buckets: []float64{1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2, 5e-2, 0.25, 1}})
	m.forwarded = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_cp_forwarded_total",
		Help: "Calls this node forwarded to the leader because it is a follower, by procedure. Route calls here mean data planes are not yet calling the leader directly."}, []string{"procedure"})
	m.streams = prometheus.NewGauge(prometheus.GaugeOpts{Name: "cart_cp_route_streams_open",
		Help: "Data planes' Route streams (RouterService.Stream) open on this node; only the leader serves them."})
	m.feedSent = prometheus.NewCounter(prometheus.CounterOpts{Name: "cart_cp_placement_feed_sent_total",
		Help: "Placements the leader sent on data planes' Route streams (the placement feed of their shadow indexes), summed over streams."})
	m.feedSkipped = prometheus.NewCounter(prometheus.CounterOpts{Name: "cart_cp_placement_feed_skipped_total",
		Help: "Placements a data plane's stream fell too far behind to be sent on the placement feed."})
	m.syncBytes = prometheus.NewGauge(prometheus.GaugeOpts{Name: "cart_cp_sync_answer_bytes",
		Help: fmt.Sprintf("Encoded size of the last Sync answer this node built (every worker with its models). Data planes read at most %d bytes; the leader refuses to build a larger one and logs an error, and warns past half of it.", c.o.MaxSyncAnswerBytes)})
	m.streamMessages = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_cp_stream_messages_total",
		Help: "Messages of data planes' Route streams, received and sent by this node (the leader), hellos included."}, []string{"direction"})
	m.streamItems = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_cp_stream_items_total",
		Help: "What those messages carried: calls received (a hello counts as one), answers and placement-feed frames sent. Divided by cart_cp_stream_messages_total, how many shared a message."}, []string{"direction"})
	m.reg.MustRegister(m.routes, m.routeTime, m.forwarded, m.streams, m.feedSent, m.feedSkipped, m.syncBytes, m.streamMessages, m.streamItems)
	for _, dir := range []string{"received", "sent"} {
		// Exported at zero from the start, so that rates cover a stream's
		// first messages.
		m.streamMessages.WithLabelValues(dir)
		m.streamItems.WithLabelValues(dir)
	}
	// The decider counts drops; exported here under the control plane's name.
	for _, cause := range decider.DropCauses {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "cart_cp_tickets_dropped_total",
			Help:        "Decisions the leader settled as undelivered without a normal completion: abandoned (the data plane gave up waiting for Route), stale (past the load lease and no longer in flight on its data plane), cap (controlplane.max_unsettled_tickets reached).",
			ConstLabels: prometheus.Labels{"cause": cause.String()}}, func() float64 { return float64(c.dec.Dropped(cause)) }))
	}
	if c.batch != nil {
		for o, name := range touchOutcomeNames {
			m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "cart_cp_touches_total",
				Help:        "Recency refreshes (touches) of blocks a chosen worker already held, by outcome: queued for replication, merged into one of the same window, limited (one was queued less than a second ago), over_budget (the window's touches already carry their most block hashes).",
				ConstLabels: prometheus.Labels{"outcome": name}}, func() float64 { return float64(c.batch.Touches(o)) }))
		}
		b := c.batch
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "cart_cp_batches_proposed_total",
			Help: "Placement batches (Raft entries) this node proposed as leader."}, func() float64 { return float64(b.proposed.Load()) }))
		for k, name := range batchKindNames {
			m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "cart_cp_batch_records_total",
				Help:        "Records in the placement batches this node proposed, by kind: placement, withdrawal, touch.",
				ConstLabels: prometheus.Labels{"kind": name}}, func() float64 { return float64(b.records[k].Load()) }))
			m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "cart_cp_batch_blocks_total",
				Help:        "Block hashes (8 bytes each on the log) in the placement batches this node proposed, by kind.",
				ConstLabels: prometheus.Labels{"kind": name}}, func() float64 { return float64(b.blocks[k].Load()) }))
		}
	}
	m.reg.MustRegister(c.dec.Collectors()...)
	if c.st != nil {
		m.reg.MustRegister(c.st.Collectors()...)
	}
	gauge := func(name, help string, f func() float64) {
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f))
	}
	status := func() (leader, term, commit, applied, last float64) {
		if c.node == nil {
			return
		}
		st := c.node.Status()
		if c.node.IsLeader() {
			leader = 1
		}
		return leader, float64(st.Term), float64(st.CommitIndex), float64(st.AppliedIndex), float64(st.LastLogIndex)
	}
	gauge("cart_raft_leader", "1 when this node is the Raft leader and serving.", func() float64 { l, _, _, _, _ := status(); return l })
	gauge("cart_raft_term", "Current Raft term.", func() float64 { _, t, _, _, _ := status(); return t })
	gauge("cart_raft_commit_index", "Raft commit index.", func() float64 { _, _, ci, _, _ := status(); return ci })
	gauge("cart_raft_applied_index", "Raft applied index.", func() float64 { _, _, _, a, _ := status(); return a })
	gauge("cart_raft_last_log_index", "Last Raft log index.", func() float64 { _, _, _, _, l := status(); return l })
	counts := func() (workers, healthy, dps, entries float64) {
		st := c.dec.Stats()
		return float64(st.Workers), float64(st.HealthyWorkers), float64(st.DataPlanes), float64(st.IndexEntries)
	}
	gauge("cart_cp_workers", "Workers in the replicated worker set.", func() float64 { w, _, _, _ := counts(); return w })
	gauge("cart_cp_healthy_workers", "Workers the leader's prober considers healthy.", func() float64 { _, h, _, _ := counts(); return h })
	gauge("cart_cp_dataplanes", "Data planes with a live load lease (leader only).", func() float64 { _, _, d, _ := counts(); return d })
	gauge("cart_cp_index_entries", "Entries in this node's prefix index.", func() float64 { _, _, _, e := counts(); return e })
	idx := func() index.Stats { st, _ := c.dec.IndexStats(); return st }
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "cart_cp_index_evictions_total",
		Help: "Entries this node's prefix index evicted (LRU, expiry, daily reset)."}, func() float64 { return float64(idx().Evicted) }))
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "cart_cp_index_skipped_inserts_total",
		Help: "New blocks this node's prefix index did not store because it was full before an eviction pass could make room."}, func() float64 { return float64(idx().SkippedInserts) }))
	gauge("cart_cp_unsettled_tickets", "Decisions waiting for their data plane to settle them (leader only).", func() float64 {
		return float64(c.dec.Stats().Unsettled)
	})
	return m
}

// Registry is where the node's /metrics come from, for components built
// beside the Core (discovery).
func (c *Core) Registry() prometheus.Registerer { return c.metrics.reg }

func (m *cpMetrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}
