package service

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/every"
)

// HandoverOptions configure the slow-leader handover
// (controlplane.slow_leader_handover): a leader that most of its data
// planes see as slow, for a sustained window, hands leadership to a
// follower. Raft cannot see this: a leader whose answers to data planes
// crawl (a congested link, a starved host) may still heartbeat in time,
// and every data plane then routes by local fallback for as long as it
// stays leader.
type HandoverOptions struct {
	Enabled bool
	// Threshold is the Route latency (a data plane's p90 over one sync
	// interval) from which that data plane counts the leader as slow.
	Threshold time.Duration
	// Window is how long a majority of reporting data planes must keep
	// seeing the leader as slow before it hands over; a data plane's
	// latest report counts for this long.
	Window time.Duration
	// MinInterval damps handovers: a node hands over at most once per
	// MinInterval, and not in its first MinInterval as leader.
	MinInterval time.Duration
}

// followerCounter is implemented by raftnode.Node.
type followerCounter interface {
	// HealthyFollowers counts voters answering the leader's heartbeats.
	HealthyFollowers() int
}

// handover is the leader's view of how slow its data planes find it.
type handover struct {
	c *Core
	o HandoverOptions

	mu        sync.Mutex
	reports   map[string]slowReport // latest per data plane
	slowSince time.Time             // zero: no majority sees us slow
	last      time.Time             // this node's last handover (any term)

	transfers *prometheus.CounterVec
}

type slowReport struct {
	at   time.Time
	slow bool
}

func newHandover(c *Core, o HandoverOptions) *handover {
	h := &handover{c: c, o: o, reports: map[string]slowReport{}}
	h.transfers = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_cp_slow_leader_handovers_total",
		Help: "Leadership handovers this node started because most data planes saw it as slow (controlplane.slow_leader_handover), by result (ok, failed)."}, []string{"result"})
	c.metrics.reg.MustRegister(h.transfers)
	return h
}

// report takes a data plane's Sync. Only latency measured against this
// node counts: a data plane calling a follower (which forwards) measures
// that follower and the hop too.
func (h *handover) report(m *cartv1.SyncRequest, now time.Time) {
	if h == nil || !h.o.Enabled || m.GetDataplaneId() == "" {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if m.GetRouteTarget() != h.c.o.APIURL {
		delete(h.reports, m.GetDataplaneId())
		return
	}
	if m.GetRouteCalls() == 0 && !m.GetRouteBreakerOpen() {
		return // no calls: no news (the last report ages out)
	}
	slow := m.GetRouteBreakerOpen() || time.Duration(m.GetRouteP90Micros())*time.Microsecond >= h.o.Threshold
	h.reports[m.GetDataplaneId()] = slowReport{at: now, slow: slow}
}

// due reports whether this leader should hand over now: a majority of the
// data planes with a report in the last window see it as slow, have done
// so for the whole window, and the damping allows it.
func (h *handover) due(now, leaderSince time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	reporting, slow := 0, 0
	for id, r := range h.reports {
		if now.Sub(r.at) > h.o.Window {
			delete(h.reports, id)
			continue
		}
		reporting++
		if r.slow {
			slow++
		}
	}
	if reporting == 0 || slow*2 <= reporting {
		h.slowSince = time.Time{}
		return false
	}
	if h.slowSince.IsZero() {
		h.slowSince = now
	}
	return now.Sub(h.slowSince) >= h.o.Window &&
		now.Sub(leaderSince) >= h.o.MinInterval &&
		(h.last.IsZero() || now.Sub(h.last) >= h.o.MinInterval)
}

// run is a leader loop: it checks the data planes' view a few times per
// window and hands over when due.
func (h *handover) run(ctx context.Context) {
	leaderSince := h.c.o.Now()
	h.mu.Lock()
	clear(h.reports) // reports of an earlier term judged another leader
	h.slowSince = time.Time{}
	h.mu.Unlock()
	every.Tick(ctx, max(h.o.Window/8, 10*time.Millisecond), nil, func() { h.tick(ctx, h.c.o.Now(), leaderSince) })
}

// tick hands leadership to the most up-to-date healthy follower when due,
// and reports whether it tried.
func (h *handover) tick(ctx context.Context, now, leaderSince time.Time) bool {
	if !h.due(now, leaderSince) {
		return false
	}
	fc, ok := h.c.node.(followerCounter)
	if !ok || fc.HealthyFollowers() == 0 {
		return false // nobody healthy to take over: a slow leader beats none
	}
	h.mu.Lock()
	h.last, h.slowSince = now, time.Time{}
	h.mu.Unlock()
	h.c.log.Warn("control plane: handing over leadership, most data planes see this leader as slow",
		"node", h.c.o.NodeID, "threshold_ms", h.o.Threshold.Milliseconds(), "window", h.o.Window.String())
	// Raft catches the most up-to-date follower up before handing over,
	// or fails; bounded so that a stuck transfer frees the loop.
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	to, err := h.c.node.TransferLeadership(tctx, "")
	cancel()
	if err != nil && ctx.Err() != nil && !h.c.node.IsLeader() {
		// Stepping down stops the leader loops, this one included, before
		// the node sees who took over: the handover itself went through.
		to, err = "(not seen yet)", nil
	}
	if err != nil {
		h.transfers.WithLabelValues("failed").Inc()
		h.c.log.Warn("control plane: slow-leader handover failed; still leading", "node", h.c.o.NodeID, "error", err.Error())
		return true
	}
	h.transfers.WithLabelValues("ok").Inc()
	h.c.log.Warn("control plane: leadership handed over (slow leader)", "audit", true, "old", h.c.o.NodeID, "new", to)
	return true
}
