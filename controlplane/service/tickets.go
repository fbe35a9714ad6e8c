package service

import (
	"slices"
	"time"

	"github.com/cartrouter/cart/controlplane/engine"
)

// Tickets are the leader's record of decisions not yet settled by their
// data plane: the load they took and the blocks they placed. A data plane
// settles them with Complete; the rules here make sure the ones it never
// settles (a Route answer that arrived after route_timeout_ms, a lost
// Complete batch) cannot pile up:
//   - a data plane reports the Route calls it gave up on (abandoned, by
//     route id), and a Route whose caller's deadline passed while the leader
//     decided is undone on the spot;
//   - past the load lease, a ticket is kept only while its data plane still
//     counts that many requests in flight on its worker (Sync);
//   - at most MaxTickets are kept: the oldest is settled as undelivered.

// Causes of tickets settled without a normal completion
// (cart_cp_tickets_dropped_total).
const (
	dropAbandoned = "abandoned" // the data plane gave up waiting for the answer
	dropStale     = "stale"     // past the lease and no longer counted in flight
	dropCap       = "cap"       // max_unsettled_tickets reached: the oldest goes
)

// defaultMaxTickets matches config's controlplane.max_unsettled_tickets.
const defaultMaxTickets = 1 << 18

type routeKey struct {
	dp string
	id uint64
}

// issue records a new ticket and, past the cap, settles the oldest ones as
// undelivered. c.mu must be held.
func (c *Core) issue(tk *ticket) (id uint64) {
	c.nextTicket++
	id = c.nextTicket
	c.tickets[id] = tk
	if tk.route != 0 {
		c.byRoute[routeKey{tk.dp, tk.route}] = id
	}
	for len(c.tickets) > c.o.MaxTickets {
		// Tickets are numbered in issue order, so the oldest live one is
		// the first number still present; the cursor only moves forward,
		// which makes finding it O(1) amortised.
		for c.oldestTicket < c.nextTicket {
			if _, ok := c.tickets[c.oldestTicket]; ok {
				break
			}
			c.oldestTicket++
		}
		c.settle(c.oldestTicket, false, true)
		c.metrics.ticketsDropped.WithLabelValues(dropCap).Inc()
	}
	return id
}

// settle forgets ticket id. It releases the decision's load when release is
// set (and the deciding data plane still accounts for it), and withdraws
// the placement when the request was not delivered, queueing the withdrawal
// for replication. It reports whether the ticket existed. c.mu must be held
// (the batcher's ledger moves with the index).
func (c *Core) settle(id uint64, delivered, release bool) bool {
	tk, ok := c.tickets[id]
	if !ok {
		return false
	}
	delete(c.tickets, id)
	if tk.route != 0 {
		delete(c.byRoute, routeKey{tk.dp, tk.route})
	}
	// Release only load the deciding data plane still accounts for: a
	// Sync that arrived before this completion may already have taken it
	// off, and releasing again would eat another data plane's load.
	if dp := c.dps[tk.dp]; release && dp != nil && dp.loads[tk.worker] > 0 {
		dp.loads[tk.worker]--
		c.eng.Release(tk.worker)
	}
	if delivered || len(tk.placed) == 0 {
		return true
	}
	c.eng.Unplace(engine.Decision{Worker: tk.worker, Placed: tk.placed})
	// The decision's time, so that undoing this withdrawal (if it never
	// commits) restores the placement as it was.
	c.batch.Unplace(tk.worker, tk.placed, tk.at)
	return true
}

// forgetDataPlane drops the tickets of a data plane whose lease expired
// (its load already left the view). c.mu must be held.
func (c *Core) forgetDataPlane(id string) {
	for k, tk := range c.tickets {
		if tk.dp == id {
			delete(c.tickets, k)
			if tk.route != 0 {
				delete(c.byRoute, routeKey{tk.dp, tk.route})
			}
		}
	}
}

// sweepStale settles, as undelivered, tickets older than the load lease
// that their data plane no longer counts in flight. A data plane's Sync
// carries its absolute in-flight count per worker: if a (data plane,
// worker) pair has more tickets than that count, the excess can only be
// decisions the data plane never used or never reported, and the oldest
// are those. Young tickets are left alone: their answer may still be on
// its way to the data plane. The load itself needs no release: Sync's
// absolute counts already exclude these. c.mu must be held.
func (c *Core) sweepStale(now time.Time) {
	type pair struct{ dp, worker string }
	young := map[pair]int{}
	old := map[pair][]uint64{}
	for id, tk := range c.tickets {
		p := pair{tk.dp, tk.worker}
		if now.Sub(tk.at) > c.o.LoadLease {
			old[p] = append(old[p], id)
		} else {
			young[p]++
		}
	}
	for p, ids := range old {
		keep := 0
		if dp := c.dps[p.dp]; dp != nil {
			keep = max(0, dp.loads[p.worker]-young[p])
		}
		if len(ids) <= keep {
			continue
		}
		slices.Sort(ids)
		for _, id := range ids[:len(ids)-keep] {
			c.settle(id, false, false)
			c.metrics.ticketsDropped.WithLabelValues(dropStale).Inc()
		}
	}
}
