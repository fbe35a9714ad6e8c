package decider

import (
	"context"
	"errors"
	"maps"
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

// ErrNotLeading: DecideFor before Lead(true) (a leader whose barrier is
// still pending) or after Lead(false).
var ErrNotLeading = errors.New("leader is still catching up (barrier pending)")

// Ledger is told, inside the critical section, of every index change a
// tracked decision makes ahead of the replicated log (the control plane's
// placement batcher). eng is lent for the call; hashes must not be
// modified afterwards.
type Ledger interface {
	Place(eng *engine.Engine, worker string, hashes []uint64, at time.Time)
	Unplace(eng *engine.Engine, worker string, hashes []uint64, at time.Time)
	// Touch: the decision refreshed worker's recency of hashes, blocks it
	// already held. Unlike Place, hashes are only lent for the call (they
	// point into the caller's pooled buffer): most touches are dropped as
	// redundant, so a copy is left to the ones that are kept.
	Touch(eng *engine.Engine, worker string, hashes []uint64, at time.Time)
}

// leaderState is the leader's soft state: tracked tickets and the load
// each data plane accounts for.
type leaderState struct {
	leading    bool
	ledger     Ledger
	nextTicket uint64
	tickets    map[uint64]*tracked
	byRoute    map[routeKey]uint64 // tickets by the data plane's route id
	// Live tickets in issue order, all of them (the cap drops the head)
	// and per (data plane, worker) pair (the stale rule drops a pair's
	// oldest): with these, neither rule walks every live ticket under the
	// lock, which with long generations and a large fleet is hundreds of
	// thousands (a full walk took 36 ms at 100k).
	all          ticketList
	pairs        map[pairKey]*ticketList
	dps          map[string]*dataPlane
	loadsVersion uint64 // worker-set version the load view was built for
}

type tracked struct {
	Ticket
	id    uint64
	dp    string
	route uint64 // the data plane's route id (0 = none)
	// A split decision's two tickets share their call's route id: the
	// decode leg's is the one byRoute finds, and pair names the prefill
	// leg's (0 = none), which leg marks.
	pair uint64
	leg  bool
	// Links of the two issue-order lists the ticket is on.
	allPrev, allNext   *tracked
	pairPrev, pairNext *tracked
}

type pairKey struct{ dp, worker string }

// ticketList is an intrusive doubly linked list of tickets in issue order;
// pair says which of a ticket's two sets of links it uses.
type ticketList struct {
	head, tail *tracked
	n          int
	pair       bool
}

func (l *ticketList) links(t *tracked) (prev, next **tracked) {
	if l.pair {
		return &t.pairPrev, &t.pairNext
	}
	return &t.allPrev, &t.allNext
}

func (l *ticketList) push(t *tracked) {
	prev, next := l.links(t)
	*prev, *next = l.tail, nil
	if l.tail != nil {
		_, tn := l.links(l.tail)
		*tn = t
	} else {
		l.head = t
	}
	l.tail = t
	l.n++
}

func (l *ticketList) remove(t *tracked) {
	prev, next := l.links(t)
	if *prev != nil {
		_, pn := l.links(*prev)
		*pn = *next
	} else {
		l.head = *next
	}
	if *next != nil {
		np, _ := l.links(*next)
		*np = *prev
	} else {
		l.tail = *prev
	}
	*prev, *next = nil, nil
	l.n--
}

type routeKey struct {
	dp string
	id uint64
}

type dataPlane struct {
	loads     map[string]int
	lastSeen  time.Time
	fallbacks uint64
	// The tickets issued to it and the completions that released load
	// that the Syncs applied so far did not account for (SyncLoads'
	// fence), and the process (SyncFence.FirstRouteID) and last Sync
	// (SyncSeq) applied.
	issued     []issuedRef
	settled    []settledRef
	firstRoute uint64
	syncSeq    uint64
}

// issuedRef is a ticket issued to the data plane and the route it answered.
type issuedRef struct{ id, route uint64 }

// settledRef is a completion that released load: the route it answered
// and the data plane's Completion.done_seq.
type settledRef struct {
	worker  string
	route   uint64
	doneSeq uint64
}

// maxSinceSync bounds dataPlane.issued and .settled, which hold what the
// Syncs applied so far did not account for: a few Sync intervals of one
// data plane's decisions at most, unless its Syncs stop. Past it the
// oldest half goes (a Sync's fence then misses those, as without one).
const maxSinceSync = 1 << 14

// appendBounded appends v to s, first dropping the oldest half when s is
// full.
func appendBounded[T any](s []T, v T) []T {
	if len(s) >= maxSinceSync {
		n := copy(s, s[len(s)/2:])
		s = s[:n]
	}
	return append(s, v)
}

// routeSpan bounds how far past a Sync's last route id a call made after
// its counts can be: route ids further away are another process's.
const routeSpan = 1 << 20

func (l *leaderState) init() {
	l.tickets = map[uint64]*tracked{}
	l.byRoute = map[routeKey]uint64{}
	l.dps = map[string]*dataPlane{}
	l.pairs = map[pairKey]*ticketList{}
}

// SetLedger installs the placement ledger. Call it before the first
// DecideFor.
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
	clear(l.pairs)
	l.all = ticketList{}
	// Tickets of an earlier leader may still arrive in Complete: start
	// this term's numbering somewhere they cannot collide with.
	l.nextTicket = rand.Uint64() >> 1
	l.leading = leading
	// Queued calls were this term's: their data planes ask the next leader.
	d.drainQueue(ErrNotLeading)
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
	// Expired, when set, reports that the caller has stopped waiting for
	// the answer: a decision made after that is undone as if ctx had
	// ended. It lets a stream call keep its timeout without a context
	// timer per call (about 2% of a leader's CPU at 5,000 routes/s).
	Expired func() bool
	// Settle are the data plane's settlements of earlier decisions that
	// came with the call: DecideFor applies the first completeChunk of
	// them in the decision's own lock hold, before deciding, and the rest
	// as Complete would, after. They are applied whatever the decision's
	// outcome, unless this decider is not leading (it has no tickets).
	Settle []Completion
}

// DecideFor decides for a data plane as the cluster's leader: the decision
// takes load on the data plane's account and, unless a dry run, records a
// tracked ticket (Decision.Ticket.ID) and queues its placement on the
// ledger. If ctx ended (or c.Expired) while it waited or decided, the
// decision is undone before anyone sees it (its caller has routed
// elsewhere) and ctx's error (or context.DeadlineExceeded) is returned.
func (d *Decider) DecideFor(ctx context.Context, c Caller, req Request) (Decision, error) {
	var rest []Completion
	if len(c.Settle) > completeChunk {
		c.Settle, rest = c.Settle[:completeChunk], c.Settle[completeChunk:]
	}
	dec, err := d.decideFor(ctx, c, req)
	if len(rest) > 0 && !errors.Is(err, ErrNotLeading) {
		d.Complete(c.DataPlane, rest) // after the decision's hold
	}
	return dec, err
}

// decideFor is DecideFor's decision, in one lock hold with c.Settle.
func (d *Decider) decideFor(ctx context.Context, c Caller, req Request) (Decision, error) {
	t := d.lock()
	defer d.unlock(OpRoute, t)
	if !d.lead.leading {
		return Decision{}, ErrNotLeading
	}
	now := d.o.Now()
	if len(c.Settle) > 0 {
		d.settleAll(c.DataPlane, c.Settle, now)
		d.pump() // what they freed goes to the waiting requests first
	}
	return d.decide(ctx, &c, req, now)
}

// track makes dec a tracked decision of c's data plane: its ticket, the
// load on the data plane's account, its placement on the ledger. d.mu held.
func (d *Decider) track(c Caller, dec *Decision, now time.Time) {
	// Placed points into the caller's pooled hash buffer; the ticket and
	// the ledger keep theirs.
	dec.ownPlaced()
	rec := d.dataPlane(c.DataPlane, now)
	var pair uint64
	if p := dec.Prefill; p != nil {
		// Issued first: a cap that drops the oldest ticket must not drop
		// this one between the two issues.
		pair = d.trackLeg(c, rec, &dec.PrefillTicket, p, true, 0, now)
	}
	d.trackLeg(c, rec, &dec.Ticket, &dec.Decision, false, pair, now)
}

// trackLeg issues t, one leg's ticket of ed, and returns its id. d.mu held.
func (d *Decider) trackLeg(c Caller, rec *dataPlane, t *Ticket, ed *engine.Decision, leg bool, pair uint64, now time.Time) uint64 {
	t.ID = d.issue(&tracked{Ticket: *t, dp: c.DataPlane, route: c.RouteID, leg: leg, pair: pair})
	rec.loads[t.Worker]++
	if c.RouteID != 0 {
		rec.issued = appendBounded(rec.issued, issuedRef{t.ID, c.RouteID})
	}
	if len(t.placed) > 0 && d.lead.ledger != nil {
		d.lead.ledger.Place(d.eng, t.Worker, t.placed, now)
	}
	if len(ed.Touched) > 0 && d.lead.ledger != nil {
		d.lead.ledger.Touch(d.eng, t.Worker, ed.Touched, now)
	}
	return t.ID
}

// Completion is a data plane's report on one tracked decision.
type Completion struct {
	Ticket uint64
	Worker string
	// Abandoned: the data plane gave up on the Route call RouteID and
	// never used its answer (it has no ticket).
	Abandoned bool
	RouteID   uint64
	// DoneSeq: the data plane's count of finished ticketed requests, this
	// one included (SyncFence.DoneSeq); 0 from an older data plane.
	DoneSeq uint64
	Outcome
}

// Complete settles a data plane's completions and reports how many
// matched a live ticket. Completions of tickets settled already, or issued
// by an earlier leader, are skipped: Sync reconciles their load.
func (d *Decider) Complete(dp string, cs []Completion) (settled int) {
	// A batch is a flush interval's completions, hundreds at thousands of
	// routes/s, each possibly withdrawing placements: settled in chunks so
	// decisions never wait behind a whole batch.
	for chunk := range slices.Chunk(cs, completeChunk) {
		settled += d.complete(dp, chunk)
	}
	return settled
}

// completeChunk bounds the completions settled in one lock hold.
const completeChunk = 64

func (d *Decider) complete(dp string, cs []Completion) (settled int) {
	t := d.lock()
	defer d.unlock(OpSettle, t)
	return d.settleAll(dp, cs, d.o.Now())
}

// settleAll settles data plane dp's completions cs and reports how many
// named a decision still open. d.mu held.
func (d *Decider) settleAll(dp string, cs []Completion, now time.Time) (settled int) {
	d.dataPlane(dp, now)
	for _, c := range cs {
		if c.Abandoned {
			id, ok := d.lead.byRoute[routeKey{dp, c.RouteID}]
			if !ok || c.RouteID == 0 {
				continue // undone when its deadline passed, or never decided
			}
			d.settlePair(id)
			settled++
			d.dropped[DropAbandoned].Add(1)
			continue
		}
		tk, ok := d.lead.tickets[c.Ticket]
		if !ok || tk.Worker != c.Worker || tk.dp != dp {
			continue
		}
		w, route := tk.Worker, tk.route
		if d.settle(c.Ticket, c.Outcome, true) && c.DoneSeq != 0 && route != 0 {
			if rec := d.lead.dps[dp]; rec != nil {
				rec.settled = appendBounded(rec.settled, settledRef{worker: w, route: route, doneSeq: c.DoneSeq})
			}
		}
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
	tk.id = id
	l.tickets[id] = tk
	if tk.route != 0 && !tk.leg {
		l.byRoute[routeKey{tk.dp, tk.route}] = id
	}
	l.all.push(tk)
	k := pairKey{tk.dp, tk.Worker}
	pl := l.pairs[k]
	if pl == nil {
		pl = &ticketList{pair: true}
		l.pairs[k] = pl
	}
	pl.push(tk)
	for len(l.tickets) > d.o.MaxTickets {
		d.settle(l.all.head.id, Outcome{}, true)
		d.dropped[DropCap].Add(1)
	}
	return id
}

// unlink takes a ticket off every table. d.mu held.
func (l *leaderState) unlink(tk *tracked) {
	delete(l.tickets, tk.id)
	if tk.route != 0 && !tk.leg {
		delete(l.byRoute, routeKey{tk.dp, tk.route})
	}
	l.all.remove(tk)
	k := pairKey{tk.dp, tk.Worker}
	if pl := l.pairs[k]; pl != nil {
		pl.remove(tk)
		if pl.n == 0 {
			delete(l.pairs, k)
		}
	}
}

// settle forgets tracked ticket id. It releases the decision's load when
// release is set (and the deciding data plane still accounts for it), and
// settles the placement by o. It reports whether it released load. d.mu
// held (the ledger moves with the index).
func (d *Decider) settle(id uint64, o Outcome, release bool) (released bool) {
	l := &d.lead
	tk, ok := l.tickets[id]
	if !ok {
		return false
	}
	l.unlink(tk)
	// Release only load the deciding data plane still accounts for: a
	// Sync without a fence (an older data plane) may already have taken
	// it off, and releasing again would eat another data plane's load.
	if dp := l.dps[tk.dp]; release && dp != nil && dp.loads[tk.Worker] > 0 {
		dp.loads[tk.Worker]--
		d.eng.Release(tk.Worker)
		released = true
	}
	d.settleIndex(&tk.Ticket, o)
	d.charge(&tk.Ticket, o)
	return released
}

// settlePair settles tracked ticket id and its prefill leg, if any, as
// undelivered: a decision its data plane never used. d.mu held.
func (d *Decider) settlePair(id uint64) {
	var pair uint64
	if tk := d.lead.tickets[id]; tk != nil {
		pair = tk.pair
	}
	d.settle(id, Outcome{}, true)
	if pair != 0 {
		d.settle(pair, Outcome{}, true)
	}
}

// SyncLoads replaces what the leader counted for data plane dp by its
// absolute in-flight counts per worker, reconciling drift both ways.
// workersVersion is the replicated worker set's version: after a change
// the load view is rebuilt from every data plane's counts. fence says what
// those counts could not include yet (see SyncFence).
func (d *Decider) SyncLoads(dp string, workersVersion uint64, inFlight map[string]int, fallbacks uint64, fence SyncFence) {
	// What needs no lock, before taking it.
	fenced := fence.LastRouteID != 0 && fence.FirstRouteID != 0 && fence.FirstRouteID <= fence.LastRouteID+1 &&
		len(fence.OpenRoutes) <= maxFence && len(fence.Unsettled) <= maxFence
	var open map[uint64]struct{}
	if fenced {
		inFlight = maps.Clone(inFlight)
		if inFlight == nil {
			inFlight = map[string]int{}
		}
		open = make(map[uint64]struct{}, len(fence.OpenRoutes))
		for _, r := range fence.OpenRoutes {
			open[r] = struct{}{}
		}
	}
	t := d.lock()
	defer d.unlock(OpSync, t)
	d.rebuildLoads(workersVersion)
	rec := d.dataPlane(dp, d.o.Now())
	if fence.FirstRouteID != 0 {
		if fence.FirstRouteID != rec.firstRoute {
			// A new process under this id (or its first Sync): what was
			// recorded for an earlier one lies outside its route ids
			// (each process starts at a random point), and fence
			// neither counts it nor keeps it.
			rec.firstRoute, rec.syncSeq = fence.FirstRouteID, 0
		} else if fence.SyncSeq <= rec.syncSeq {
			return // late or repeated: a newer Sync was applied
		}
		rec.syncSeq = fence.SyncSeq
	}
	rec.fallbacks += fallbacks
	if fenced {
		d.fence(dp, rec, inFlight, open, fence)
	} else if fence.FirstRouteID == 0 {
		rec.issued, rec.settled = rec.issued[:0], rec.settled[:0] // an older data plane: never fenced
	}
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

// SyncFence is what a data plane's in-flight counts, taken at one
// instant, cannot include yet. Without it the leader, replacing its count
// by them, would lose each decision whose answer was still on its way,
// and each finished request whose report was, until the next Sync; and it
// would keep a request that finished and was reported after the counts
// were taken but before they arrived.
type SyncFence struct {
	// FirstRouteID names the data plane's process (its first route id);
	// SyncSeq numbers its Syncs: one not newer than the last applied is
	// ignored. 0: an older data plane, whose Syncs are all applied.
	FirstRouteID, SyncSeq uint64
	// LastRouteID is the newest route id the data plane had sent; 0: no
	// fence, the counts are taken as they are.
	LastRouteID uint64
	// OpenRoutes: calls without an answer yet, and abandoned calls whose
	// report is not acknowledged.
	OpenRoutes []uint64
	// Unsettled: tickets of finished requests whose report is not
	// acknowledged.
	Unsettled []uint64
	// DoneSeq: how many ticketed requests had finished (Completion.DoneSeq).
	DoneSeq uint64
}

// maxFence bounds the fence lists the leader reads from one Sync: a Sync
// with longer ones is taken without its fence.
const maxFence = 1 << 16

// fence adds to dp's counts what its fence says they could not include:
// decisions still held as tickets whose answer had not arrived (an open
// call, or one made after the counts were taken) or whose request had
// finished unreported, their reports releasing them later; and takes off
// completions settled already that finished after the counts were taken,
// which still include them. It then forgets what this Sync accounted for.
// d.mu held.
func (d *Decider) fence(dp string, rec *dataPlane, counts map[string]int, open map[uint64]struct{}, f SyncFence) {
	l := &d.lead
	// This process's calls made after the counts were taken.
	after := func(route uint64) bool { return route > f.LastRouteID && route-f.LastRouteID <= routeSpan }
	// Each ticket once, whatever the lists repeat.
	added := map[uint64]struct{}{}
	add := func(id uint64) {
		tk := l.tickets[id]
		if tk == nil || tk.dp != dp {
			return
		}
		if _, dup := added[id]; !dup {
			added[id] = struct{}{}
			counts[tk.Worker]++
		}
	}
	for r := range open {
		if id, ok := l.byRoute[routeKey{dp, r}]; ok {
			add(id)
			if tk := l.tickets[id]; tk.pair != 0 {
				add(tk.pair) // the open call's other leg
			}
		}
	}
	for _, u := range f.Unsettled {
		add(u)
	}
	kept := rec.issued[:0]
	for _, is := range rec.issued {
		if after(is.route) {
			add(is.id)
			kept = append(kept, is)
		}
	}
	rec.issued = kept
	keptS := rec.settled[:0]
	for _, s := range rec.settled {
		if s.doneSeq <= f.DoneSeq || s.route < f.FirstRouteID || s.route > f.LastRouteID+routeSpan {
			continue // accounted for by these counts, or another process's
		}
		keptS = append(keptS, s)
		_, wasOpen := open[s.route]
		// Answered before the counts were taken (so counted), finished
		// after (so still counted), and released already.
		if s.route <= f.LastRouteID && !wasOpen && counts[s.worker] > 0 {
			counts[s.worker]--
		}
	}
	rec.settled = keptS
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
// (its load already left the view): a walk over its own tickets only.
// d.mu held.
func (d *Decider) forgetDataPlane(id string) {
	l := &d.lead
	for k, pl := range l.pairs {
		if k.dp != id {
			continue
		}
		for pl.head != nil {
			l.unlink(pl.head)
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
// absolute counts already exclude these. With old + young = live, the
// number to settle is min(old, live - counted), taken oldest first, so a
// pair costs nothing unless it has more tickets than its count. d.mu held.
func (d *Decider) sweepStale(now time.Time) {
	l := &d.lead
	for k, pl := range l.pairs {
		counted := 0
		if dp := l.dps[k.dp]; dp != nil {
			counted = dp.loads[k.worker]
		}
		for excess := pl.n - counted; excess > 0 && pl.head != nil && now.Sub(pl.head.at) > d.o.LoadLease; excess-- {
			d.settle(pl.head.id, Outcome{}, false) // may delete pl from pairs: pl stays valid
			d.dropped[DropStale].Add(1)
		}
	}
}
