package decider

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Op names a kind of critical section, the op label of
// cart_decider_lock_hold_seconds.
type Op uint8

// Critical sections. The ones callers pass to Do are marked.
const (
	OpRoute           Op = iota // a decision
	OpSettle                    // settling decisions (in process or Complete)
	OpSync                      // a data plane's Sync replacing its counts
	OpSweep                     // lease expiry and stale tickets
	OpLead                      // a leadership change resetting soft state
	OpMaintain                  // one eviction / expiry step
	OpReset                     // the daily reset
	OpApply                     // Do: one replicated command (worker set, members)
	OpApplyBatch                // Do: one chunk of replicated placements
	OpSnapshotCapture           // Do: copying the state for a snapshot
	OpSnapshotRestore           // Do: installing a snapshot
	OpLedger                    // Do: the leader's ledger of placements ahead of the log
	OpKV                        // Do: an engine's KV-event report (occupancy, clears, evictions)
	OpSeed                      // one step seeding a worker's cache model from the index
	OpRead                      // reads for status pages, gauges and tests
	OpAdmin                     // worker set, health, draining
	numOps
)

var opNames = [numOps]string{
	OpRoute: "route", OpSettle: "settle", OpSync: "sync", OpSweep: "sweep", OpLead: "lead",
	OpMaintain: "maintain", OpReset: "reset", OpApply: "apply", OpApplyBatch: "apply_batch",
	OpSnapshotCapture: "snapshot_capture", OpSnapshotRestore: "snapshot_restore",
	OpLedger: "ledger", OpKV: "kv", OpSeed: "seed", OpRead: "read", OpAdmin: "admin",
}

func (op Op) String() string {
	if op < numOps {
		return opNames[op]
	}
	return "unknown"
}

// LockHoldBuckets span 10µs to 100ms: routing decisions hold the lock for
// microseconds, and issue 13's target is that nothing holds it past 1 ms.
var LockHoldBuckets = []float64{1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 1e-1}

type holdMetrics struct {
	vec, waitVec *prometheus.HistogramVec
	// resolved once: no label lookup per hold
	by, wait [numOps]prometheus.Observer
}

func (h *holdMetrics) init() {
	h.vec = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "cart_decider_lock_hold_seconds",
		Help:    "How long each operation held the routing core's lock; decisions wait behind the longest.",
		Buckets: LockHoldBuckets,
	}, []string{"op"})
	h.waitVec = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "cart_decider_lock_wait_seconds",
		Help:    "How long each operation waited for the routing core's lock before it held it: other holders, and the time a waiting goroutine takes to run once the lock is free.",
		Buckets: LockHoldBuckets,
	}, []string{"op"})
	for op := range numOps {
		h.by[op] = h.vec.WithLabelValues(op.String())
		h.wait[op] = h.waitVec.WithLabelValues(op.String())
	}
}

// Collectors are the decider's metrics, for the host's registry: the
// lock-hold and lock-wait histograms, the count of settlements refused for
// a foreign ticket and of the passes the index's size asked for.
func (d *Decider) Collectors() []prometheus.Collector {
	cs := []prometheus.Collector{d.hold.vec, d.hold.waitVec, prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "cart_decider_rejected_tickets_total",
		Help: "Settlements refused because the ticket was not issued by this routing core (expected to stay 0).",
	}, func() float64 { return float64(d.rejected.Load()) }), prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "cart_decider_pressure_passes_total",
		Help: "Maintenance passes that found the prefix index past half of its headroom (it asks for one at once when it grows there).",
	}, func() float64 { return float64(d.kicked.Load()) })}
	return append(cs, d.fm.collectors(d)...)
}

// held is when a lock was asked for and when it was taken.
type held struct{ asked, got time.Time }

// lock takes the lock and returns when it asked and when it got it.
func (d *Decider) lock() held {
	asked := time.Now()
	d.mu.Lock()
	return held{asked: asked, got: time.Now()}
}

// unlock releases the lock and records how long op waited for it and held
// it (observed after releasing, so the bookkeeping is not part of the
// hold).
func (d *Decider) unlock(op Op, t held) {
	d.pump()
	hold := time.Since(t.got)
	if d.pressure != nil && !d.maintaining.Load() && d.eng.Index().Len() > d.highWater {
		select {
		case d.pressure <- struct{}{}:
		default: // a pass is already asked for
		}
	}
	d.mu.Unlock()
	d.hold.by[op].Observe(hold.Seconds())
	d.hold.wait[op].Observe(t.got.Sub(t.asked).Seconds())
}
