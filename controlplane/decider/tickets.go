package decider

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/cartrouter/cart/controlplane/engine"
)

// Tracked tickets are a control-plane leader's record of decisions not yet
// settled by their data plane: the load they took and the blocks they
// placed. A data plane settles them with Complete; the rules here make sure
// the ones it never settles (a Route answer that arrived after
// route_timeout_ms, a lost Complete batch) cannot pile up:
//   - a data plane reports the Route calls it gave up on (abandoned, by
//     route id), and a Route whose caller's deadline passed while the leader
//     decided is undone on the spot;
//   - past the load lease, a ticket is kept only while its data plane still
//     counts that many requests in flight on its worker (Sync);
//   - at most MaxTickets are kept: the oldest is settled as undelivered.

// DropCause says why a tracked ticket was settled without a normal
// completion (cart_cp_tickets_dropped_total).
type DropCause uint8

// Drop causes.
const (
	DropAbandoned DropCause = iota // the data plane gave up waiting for the answer
	DropStale                      // past the lease and no longer counted in flight
	DropCap                        // max_unsettled_tickets reached: the oldest goes
	numDropCauses
)

// DropCauses lists every cause, for exporting the counters.
var DropCauses = []DropCause{DropAbandoned, DropStale, DropCap}

func (c DropCause) String() string {
	switch c {
	case DropAbandoned:
		return "abandoned"
	case DropStale:
		return "stale"
	case DropCap:
		return "cap"
	}
	return "unknown"
}

// Dropped counts tickets settled for cause.
func (d *Decider) Dropped(cause DropCause) uint64 { return d.dropped[cause].Load() }

// DefaultMaxTickets matches config's controlplane.max_unsettled_tickets.
const DefaultMaxTickets = 1 << 18

// ErrNotLeading: RouteFor before Lead(true) (a leader whose barrier is
// still pending) or after Lead(false).
var ErrNotLeading = errors.New("leader is still catching up (barrier pending)")

// Ledger is told, inside the critical section, of every index change a
// tracked decision makes ahead of the replicated log (the control plane's
// placement batcher). eng is lent for the call; hashes must not be
// modified afterwards.
type Ledger interface {
	Place(eng *engine.Engine, worker string, hashes []uint64, at time.Time)
	Unplace(eng *engine.Engine, worker string, hashes []uint64, at time.Time)
}

// leaderState is the leader's soft state: tracked tickets and the load
// each data plane accounts for.
type leaderState struct {
	leading      bool
	ledger       Ledger
	nextTicket   uint64
	oldestTicket uint64 // no live ticket is numbered below this
	tickets      map[uint64]*tracked
	byRoute      map[routeKey]uint64 // tickets by the data plane's route id
	dps          map[string]*dataPlane
	loadsVersion uint64 // worker-set version the load view was built for
}

type tracked struct {
	Ticket
	dp    string
	route uint64 // the data plane's route id (0 = none)
}

type routeKey struct {
	dp string
	id uint64
}

type dataPlane struct {
	loads     map[string]int
	lastSeen  time.Time
	fallbacks uint64
}

func (l *leaderState) init() {
	l.tickets = map[uint64]*tracked{}
	l.byRoute = map[routeKey]uint64{}
	l.dps = map[string]*dataPlane{}
}

// SetLedger installs the placement ledger. Call it before the first
// RouteFor.
func (d *Decider) SetLedger(l Ledger) {
	t := d.lock()
	defer d.unlock(OpAdmin, t)
	d.lead.ledger = l
}

// LoadLease is the configured lease (Options.LoadLease).
func (d *Decider) LoadLease() time.Duration { return d.o.LoadLease }

// Lead starts a term as the cluster's decider (leading) or ends it. Either
// way the leader's soft state starts clean: load is rebuilt from data-plane
// syncs within one sync interval rather than trusted stale, and health
// verdicts restart with the new leader's prober, which assumes healthy
// until probes say otherwise.
func (d *Decider) Lead(leading bool) {
	t := d.lock()
	defer d.unlock(OpLead, t)
	d.eng.ResetLoads()
	for _, w := range d.eng.Workers() {
		d.eng.SetHealthy(w.URL, true)
	}
	l := &d.lead
	clear(l.tickets)
	clear(l.byRoute)
	clear(l.dps)
	// Tickets of an earlier leader may still arrive in Complete: start
	// this term's numbering somewhere they cannot collide with.
	l.nextTicket = rand.Uint64() >> 1
	l.oldestTicket = l.nextTicket + 1
	l.leading = leading
}

// Leading reports whether Lead(true) is in effect.
func (d *Decider) Leading() bool {
	t := d.lock()
	defer d.unlock(OpRead, t)
	return d.lead.leading
}

// Caller identifies who asked for a tracked decision.
type Caller struct {
	DataPlane string
	RouteID   uint64 // the data plane's id for the call (0 = none)
}

// RouteFor decides for a data plane as the cluster's leader: the decision
// takes load on the data plane's account and, unless a dry run, records a
// tracked ticket (Decision.Ticket.ID) and queues its placement on the
// ledger. If ctx ended while it waited or decided, the decision is undone
// before anyone sees it (its caller has routed elsewhere) and ctx's error
// is returned.
func (d *Decider) RouteFor(ctx context.Context, c Caller, req Request) (Decision, error) {
	t := d.lock()
	defer d.unlock(OpRoute, t)
	if !d.lead.leading {
		return Decision{}, ErrNotLeading
	}
	now := d.o.Now()
	dec, err := d.route(req, now)
	if err != nil || req.DryRun {
		return dec, err
	}
	if ctx.Err() != nil {
		d.eng.Release(dec.Worker)
		d.eng.Unplace(dec.Decision)
		d.dropped[DropAbandoned].Add(1)
		return Decision{}, ctx.Err()
	}
	dec.Ticket.placed = slices.Clone(dec.Placed)
	dec.Ticket.ID = d.issue(&tracked{Ticket: dec.Ticket, dp: c.DataPlane, route: c.RouteID})
	d.dataPlane(c.DataPlane, now).loads[dec.Worker]++
	if len(dec.Ticket.placed) > 0 && d.lead.ledger != nil {
		d.lead.ledger.Place(d.eng, dec.Worker, dec.Ticket.placed, now)
	}
	return dec, nil
}

// Completion is a data plane's report on one tracked decision.
type Completion struct {
	Ticket uint64
	Worker string
	// Abandoned: the data plane gave up on the Route call RouteID and
	// never used its answer (it has no ticket).
	Abandoned bool
	RouteID   uint64
	Outcome
}

// Complete settles a data plane's completions and reports how many
// matched a live ticket. Completions of tickets settled already, or issued
// by an earlier leader, are skipped: Sync reconciles their load.
func (d *Decider) Complete(dp string, cs []Completion) (settled int) {
	t := d.lock()
	defer d.unlock(OpSettle, t)
	d.dataPlane(dp, d.o.Now())
	for _, c := range cs {
		if c.Abandoned {
			id, ok := d.lead.byRoute[routeKey{dp, c.RouteID}]
			if !ok || c.RouteID == 0 {
				continue // undone when its deadline passed, or never decided
			}
			d.settle(id, Outcome{}, true)
			settled++
			d.dropped[DropAbandoned].Add(1)
			continue
		}
		tk, ok := d.lead.tickets[c.Ticket]
		if !ok || tk.Worker != c.Worker || tk.dp != dp {
			continue
		}
		d.settle(c.Ticket, c.Outcome, true)
		settled++
	}
	return settled
}

// dataPlane returns (creating) a data plane's record. d.mu held.
func (d *Decider) dataPlane(id string, now time.Time) *dataPlane {
	dp, ok := d.lead.dps[id]
	if !ok {
		dp = &dataPlane{loads: map[string]int{}}
		d.lead.dps[id] = dp
	}
	dp.lastSeen = now
	return dp
}

// issue records a new ticket and, past the cap, settles the oldest ones as
// undelivered. d.mu held.
func (d *Decider) issue(tk *tracked) (id uint64) {
	l := &d.lead
	l.nextTicket++
	id = l.nextTicket
	l.tickets[id] = tk
	if tk.route != 0 {
		l.byRoute[routeKey{tk.dp, tk.route}] = id
	}
	for len(l.tickets) > d.o.MaxTickets {
		// Tickets are numbered in issue order, so the oldest live one is
		// the first number still present; the cursor only moves forward,
		// which makes finding it O(1) amortised.
		for l.oldestTicket < l.nextTicket {
			if _, ok := l.tickets[l.oldestTicket]; ok {
				break
			}
			l.oldestTicket++
		}
		d.settle(l.oldestTicket, Outcome{}, true)
		d.dropped[DropCap].Add(1)
	}
	return id
}

// settle forgets tracked ticket id. It releases the decision's load when
// release is set (and the deciding data plane still accounts for it), and
// settles the placement by o. It reports whether the ticket existed. d.mu
// held (the ledger moves with the index).
func (d *Decider) settle(id uint64, o Outcome, release bool) bool {
	l := &d.lead
	tk, ok := l.tickets[id]
	if !ok {
		return false
	}
	delete(l.tickets, id)
	if tk.route != 0 {
		delete(l.byRoute, routeKey{tk.dp, tk.route})
	}
	// Release only load the deciding data plane still accounts for: a
	// Sync that arrived before this completion may already have taken it
	// off, and releasing again would eat another data plane's load.
	if dp := l.dps[tk.dp]; release && dp != nil && dp.loads[tk.Worker] > 0 {
		dp.loads[tk.Worker]--
		d.eng.Release(tk.Worker)
	}
	d.settleIndex(&tk.Ticket, o)
	return true
}

// SyncLoads replaces what the leader counted for data plane dp by its
// absolute in-flight counts per worker, reconciling drift both ways.
// workersVersion is the replicated worker set's version: after a change
// the load view is rebuilt from every data plane's counts.
func (d *Decider) SyncLoads(dp string, workersVersion uint64, inFlight map[string]int, fallbacks uint64) {
	t := d.lock()
	defer d.unlock(OpSync, t)
	d.rebuildLoads(workersVersion)
	rec := d.dataPlane(dp, d.o.Now())
	rec.fallbacks += fallbacks
	for w, n := range rec.loads {
		if _, ok := inFlight[w]; !ok {
			d.eng.AdjustLoad(w, -n)
			delete(rec.loads, w)
		}
	}
	for w, n := range inFlight {
		if _, known := d.eng.WorkerIDOf(w); !known {
			// Removed (or not yet added): nothing to account it to.
			d.eng.AdjustLoad(w, -rec.loads[w])
			delete(rec.loads, w)
			continue
		}
		d.eng.AdjustLoad(w, n-rec.loads[w])
		rec.loads[w] = n
	}
}

// rebuildLoads recomputes the engine's load view from the data planes'
// counts after the worker set changed: a worker removed and added again
// comes back with load 0 in the engine while data planes still count
// requests on it. d.mu held.
func (d *Decider) rebuildLoads(version uint64) {
	l := &d.lead
	if version == l.loadsVersion {
		return
	}
	l.loadsVersion = version
	d.eng.ResetLoads()
	for _, dp := range l.dps {
		for w, n := range dp.loads {
			if _, known := d.eng.WorkerIDOf(w); known {
				d.eng.AdjustLoad(w, n)
			} else {
				delete(dp.loads, w)
			}
		}
	}
}

// Sweep drops data planes whose syncs stopped for longer than the lease
// (their load leaves the view, their tickets are forgotten) and settles
// stale tickets. It returns the data planes dropped.
func (d *Decider) Sweep() (expired []string) {
	t := d.lock()
	defer d.unlock(OpSweep, t)
	now := d.o.Now()
	for id, dp := range d.lead.dps {
		if now.Sub(dp.lastSeen) <= d.o.LoadLease {
			continue
		}
		for w, n := range dp.loads {
			d.eng.AdjustLoad(w, -n)
		}
		delete(d.lead.dps, id)
		d.forgetDataPlane(id)
		expired = append(expired, id)
	}
	d.sweepStale(now)
	return expired
}

// forgetDataPlane drops the tickets of a data plane whose lease expired
// (its load already left the view). d.mu held.
func (d *Decider) forgetDataPlane(id string) {
	for k, tk := range d.lead.tickets {
		if tk.dp == id {
			delete(d.lead.tickets, k)
			if tk.route != 0 {
				delete(d.lead.byRoute, routeKey{tk.dp, tk.route})
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
// absolute counts already exclude these. d.mu held.
func (d *Decider) sweepStale(now time.Time) {
	type pair struct{ dp, worker string }
	young := map[pair]int{}
	old := map[pair][]uint64{}
	for id, tk := range d.lead.tickets {
		p := pair{tk.dp, tk.Worker}
		if now.Sub(tk.at) > d.o.LoadLease {
			old[p] = append(old[p], id)
		} else {
			young[p]++
		}
	}
	for p, ids := range old {
		keep := 0
		if dp := d.lead.dps[p.dp]; dp != nil {
			keep = max(0, dp.loads[p.worker]-young[p])
		}
		if len(ids) <= keep {
			continue
		}
		slices.Sort(ids)
		for _, id := range ids[:len(ids)-keep] {
			d.settle(id, Outcome{}, false)
			d.dropped[DropStale].Add(1)
		}
	}
}
