package decider

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/flow"
)

// ---- flow control ----------------------------------------------------------
//
// When every worker a request may use is saturated (engine/saturation.go),
// Admit does not refuse it: the request waits in the decider's queue
// (controlplane/flow), and the next time a worker may have room — a
// release, a worker back, a raised limit: anything that moves the engine's
// Freed count — the same lock hold that freed it offers the waiting
// requests, in the queue's policy order, to the engine, which binds each to
// the cache-aware choice among the workers with room (late binding). The
// queue lives where the load view lives: in process for the all-in-one
// router, on the leader for the whole fleet.

// FlowOptions configure flow control.
type FlowOptions struct {
	// Off makes a saturated pool an ErrNoCapacity at once (503), as before
	// flow control.
	Off    bool
	Limits flow.Limits
	// QueueTimeout is how long a request waits at most (0: 30 s).
	QueueTimeout time.Duration
	// ReserveWindow is how long the headroom (engine.Policy.ReserveSlots)
	// stays in force after the last request of priority >=
	// ReservePriority (0: 10 s).
	ReserveWindow time.Duration
	// RetryAfter is what a refused request is told to wait (0: 1 s).
	RetryAfter time.Duration
}

// maxDispatchTries bounds the requests one dispatch pass offers the
// engine (each a decision, ~10-50 µs), so a pass stays well under a
// millisecond of lock hold however long the queue.
const maxDispatchTries = 64

// Admission is what flow control needs to know about a request.
type Admission struct {
	// Tenant is the fairness key; Label the tenant's name for metrics
	// (the client key's name: a header-refined tenant is not a label).
	Tenant, Label string
	Priority      int
	Weight        float64
	// Deadline, when set, orders the request among its tenant's (earliest
	// first) and ends its wait if earlier than the queue timeout.
	Deadline time.Time
	// Arrival is when the request arrived (zero: now); a retry keeps its
	// first arrival, so it does not lose its place.
	Arrival time.Time
	Bytes   int64
	// Cost is the tokens the request is expected to be served (its
	// prompt, estimated): charged to the tenant when it is dispatched from
	// the queue, corrected by its usage report.
	Cost int64
	// OnQueued, when set, is called (outside the lock) when the request
	// starts waiting.
	OnQueued func()
}

// RefusedError answers a request flow control turned away: 429, with
// RetryAfter.
type RefusedError struct {
	Reason     string // shed, timeout, queue_full, tenant_full
	Err        error
	RetryAfter time.Duration
}

func (e *RefusedError) Error() string { return e.Err.Error() }
func (e *RefusedError) Unwrap() error { return ErrRefused }

// ErrRefused marks flow control's refusals (RefusedError).
var ErrRefused = errors.New("refused by flow control")

// Refusal reasons (cart_flow_refused_total{reason}).
const (
	RefusedShed       = "shed"
	RefusedTimeout    = "timeout"
	RefusedQueueFull  = "queue_full"
	RefusedTenantFull = "tenant_full"
)

type waiter struct {
	ctx     context.Context
	caller  *Caller // nil: an in-process decision
	req     Request
	adm     Admission
	arrival time.Time
	done    chan admitted // buffered: the dispatch never blocks
	item    *flow.Item[*waiter]
}

type admitted struct {
	dec Decision
	err error
}

func (d *Decider) initFlow() {
	f := &d.o.Flow
	if f.QueueTimeout <= 0 {
		f.QueueTimeout = 30 * time.Second
	}
	if f.ReserveWindow <= 0 {
		f.ReserveWindow = 10 * time.Second
	}
	if f.RetryAfter <= 0 {
		f.RetryAfter = time.Second
	}
	d.fq = flow.New[*waiter](f.Limits)
	d.fm.init()
}

// Admit decides req in process, waiting in the queue while the pool is
// saturated, until a worker takes it, flow control refuses it
// (*RefusedError), it cannot be served (ErrNoCapacity), or ctx ends (the
// client left; it leaves the queue at once). The caller settles the
// decision with Settle.
func (d *Decider) Admit(ctx context.Context, req Request, a Admission) (Decision, error) {
	return d.admit(ctx, nil, req, a)
}

// AdmitFor is Admit for a data plane, as the cluster's leader (DecideFor's
// tracked decision, queued fleet-wide).
func (d *Decider) AdmitFor(ctx context.Context, c Caller, req Request, a Admission) (Decision, error) {
	var rest []Completion
	if len(c.Settle) > completeChunk {
		c.Settle, rest = c.Settle[:completeChunk], c.Settle[completeChunk:]
	}
	dec, err := d.admit(ctx, &c, req, a)
	if len(rest) > 0 && !errors.Is(err, ErrNotLeading) {
		d.Complete(c.DataPlane, rest)
	}
	return dec, err
}

func (d *Decider) admit(ctx context.Context, c *Caller, req Request, a Admission) (Decision, error) {
	t := d.lock()
	now := d.o.Now()
	if c != nil {
		if !d.lead.leading {
			d.unlock(OpRoute, t)
			return Decision{}, ErrNotLeading
		}
		if len(c.Settle) > 0 {
			d.settleAll(c.DataPlane, c.Settle, now)
			// The room those completions freed goes to the requests
			// already waiting, not to this newer one that carried them.
			d.pump()
		}
	}
	d.noteReserve(a.Priority, now)
	req.Priority = a.Priority
	// With requests waiting, a probe's slot is theirs to take (pump), the
	// last of them in the policy's order; with none, this one may.
	req.NoProbe = d.fq != nil && d.fq.Len() > 0
	dec, err := d.decide(ctx, c, req, now)
	if err == nil || d.o.Flow.Off || req.DryRun || !errors.Is(err, engine.ErrAllSaturated) {
		if err == nil {
			// Under the lock: the queue and the leader's tickets are its.
			dec.Ticket.tenant, dec.Ticket.epoch = a.Tenant, d.epoch(a.Tenant)
			d.setTicketTenant(dec.Ticket.ID, a.Tenant, 0, dec.Ticket.epoch)
			if d.fq != nil && !req.DryRun {
				d.fq.Started(a.Tenant)
			}
		}
		d.unlock(OpRoute, t)
		if err != nil {
			return Decision{}, capacity(err)
		}
		if c == nil {
			dec.ownPlaced() // track cloned a tracked one's
		}
		return dec, nil
	}
	if a.Priority < 0 {
		d.unlock(OpRoute, t)
		d.fm.refused(RefusedShed)
		return Decision{}, &RefusedError{Reason: RefusedShed, RetryAfter: d.o.Flow.RetryAfter,
			Err: errors.New("the pool is saturated and this request's priority is sheddable (below 0): refused rather than queued")}
	}
	arrival := a.Arrival
	if arrival.IsZero() || arrival.After(now) {
		arrival = now
	}
	until := arrival.Add(d.o.Flow.QueueTimeout)
	if !a.Deadline.IsZero() && a.Deadline.Before(until) {
		until = a.Deadline
	}
	w := &waiter{ctx: ctx, caller: c, req: req, adm: a, arrival: arrival, done: make(chan admitted, 1)}
	w.item = &flow.Item[*waiter]{Tenant: a.Tenant, Priority: a.Priority, Weight: a.Weight, Deadline: until.UnixNano(),
		Bytes: a.Bytes, Cost: a.Cost, Value: w}
	if err := d.fq.Push(w.item); err != nil {
		d.unlock(OpRoute, t)
		var full *flow.ErrFull
		reason := RefusedQueueFull
		if errors.As(err, &full) && full.Scope == "tenant" {
			reason = RefusedTenantFull
		}
		d.fm.refused(reason)
		return Decision{}, &RefusedError{Reason: reason, RetryAfter: d.o.Flow.RetryAfter, Err: err}
	}
	d.fm.enqueued.Inc()
	d.unlock(OpRoute, t)
	if a.OnQueued != nil {
		a.OnQueued()
	}
	timer := time.NewTimer(until.Sub(now))
	defer timer.Stop()
	select {
	case r := <-w.done:
		r.dec.Waited = d.o.Now().Sub(arrival)
		return r.dec, r.err
	case <-ctx.Done():
		return d.leave(w, ctx.Err(), "")
	case <-timer.C:
		return d.leave(w, &RefusedError{Reason: RefusedTimeout, RetryAfter: d.o.Flow.RetryAfter,
			Err: fmt.Errorf("no worker had room within the queue timeout (%s)", until.Sub(arrival).Round(time.Millisecond))}, RefusedTimeout)
	}
}

// leave takes a waiter out of the queue with err. If a dispatch bound it
// meanwhile (its answer is already in w.done), the decision is undone as
// never delivered.
func (d *Decider) leave(w *waiter, err error, reason string) (Decision, error) {
	t := d.lock()
	if d.fq.Remove(w.item) {
		d.unlock(OpRoute, t)
		if reason != "" {
			d.fm.refused(reason)
		} else {
			d.fm.cancelled.Inc()
		}
		return Decision{}, err
	}
	r := <-w.done // sent under the lock that dispatched it
	if r.err == nil {
		d.undo(w.caller, r.dec)
	}
	d.unlock(OpRoute, t)
	return Decision{}, err
}

// undo releases a decision nobody will use. d.mu held.
func (d *Decider) undo(c *Caller, dec Decision) {
	if c != nil && dec.Ticket.ID != 0 {
		d.settlePair(dec.Ticket.ID)
		d.dropped[DropAbandoned].Add(1)
		return
	}
	d.eng.Release(dec.Worker)
	d.settleIndex(&dec.Ticket, Outcome{})
	if dec.Split() {
		d.eng.Release(dec.PrefillTicket.Worker)
		d.settleIndex(&dec.PrefillTicket, Outcome{})
	}
}

// decide is one decision under the lock: for a data plane (c != nil) a
// tracked one, as DecideFor makes it.
func (d *Decider) decide(ctx context.Context, c *Caller, req Request, now time.Time) (Decision, error) {
	dec, err := d.choose(req, now)
	if err != nil || req.DryRun || c == nil {
		return dec, err
	}
	if err := ctx.Err(); err != nil || c.Expired != nil && c.Expired() {
		d.drop(dec)
		d.dropped[DropAbandoned].Add(1)
		if err == nil {
			err = context.DeadlineExceeded
		}
		return Decision{}, err
	}
	d.track(*c, &dec, now)
	return dec, nil
}

// pump offers the waiting requests to the engine if something may have
// freed room since the last pass. d.mu held; called by unlock.
func (d *Decider) pump() {
	if d.fq == nil || d.fq.Len() == 0 || d.eng.Freed() == d.freedSeen {
		return
	}
	d.freedSeen = d.eng.Freed()
	now := d.o.Now()
	d.reserveExpiry(now)
	d.fq.Dispatch(maxDispatchTries, d.offer(now, true))
	if d.fq.Len() > 0 && d.eng.ProbeRoom() {
		// A probe's slot may be one the engine does not have: the request
		// it takes may wait there behind a whole running sequence. It goes
		// to the request the policy would serve last (the lowest band's
		// most-served tenant), not to the one owed the next real slot.
		d.fq.DispatchLast(maxDispatchTries, d.offer(now, false))
	}
	// Dispatching releases nothing, but an undone expired call does: the
	// count after the pass is what the next one compares with.
	d.freedSeen = d.eng.Freed()
}

// offer is a dispatch pass's callback: it binds a waiting request to a
// worker with room (noProbe: not in a probe's slot). d.mu held.
func (d *Decider) offer(now time.Time, noProbe bool) func(*flow.Item[*waiter]) flow.Verdict {
	return func(it *flow.Item[*waiter]) flow.Verdict {
		w := it.Value
		if noProbe && !d.eng.HasRoom(w.adm.Priority, true) {
			// Nobody has room at this priority, nor below it (the bands
			// come highest first and the headroom only lowers limits).
			return flow.Stop
		}
		if !noProbe && !d.eng.ProbeRoom() {
			return flow.Stop // the probes' slots are taken
		}
		if w.caller != nil && !d.lead.leading {
			w.done <- admitted{err: ErrNotLeading}
			return flow.Dropped
		}
		req := w.req
		req.NoProbe = noProbe
		dec, err := d.decide(w.ctx, w.caller, req, now)
		switch {
		case err == nil:
			if w.caller == nil {
				dec.ownPlaced()
			}
			dec.Ticket.tenant, dec.Ticket.cost, dec.Ticket.epoch = w.adm.Tenant, w.adm.Cost, d.epoch(w.adm.Tenant)
			d.setTicketTenant(dec.Ticket.ID, w.adm.Tenant, w.adm.Cost, dec.Ticket.epoch)
			d.fm.dispatched(w.adm, now.Sub(w.arrival))
			w.done <- admitted{dec: dec}
			return flow.Taken
		case errors.Is(err, engine.ErrAllSaturated):
			return flow.Skip
		}
		w.done <- admitted{err: capacity(err)}
		return flow.Dropped
	}
}

// setTicketTenant records on a tracked ticket (id != 0) whom its usage
// report charges: the leader settles by id, from its own record. d.mu held.
func (d *Decider) setTicketTenant(id uint64, tenant string, cost int64, epoch uint64) {
	if tk := d.lead.tickets[id]; id != 0 && tk != nil {
		tk.tenant, tk.cost, tk.epoch = tenant, cost, epoch
	}
}

// epoch is tenant's lift number in the queue (flow.Queue.Epoch). d.mu held.
func (d *Decider) epoch(tenant string) uint64 {
	if d.fq == nil {
		return 0
	}
	return d.fq.Epoch(tenant)
}

// noteReserve keeps the headroom on while high-priority traffic comes.
// d.mu held.
func (d *Decider) noteReserve(prio int, now time.Time) {
	pol := d.eng.Policy()
	if pol.ReserveSlots > 0 && prio >= pol.ReservePriority {
		d.reserveUntil = now.Add(d.o.Flow.ReserveWindow)
		if !d.eng.ReserveActive() {
			d.eng.SetReserveActive(true)
		}
		return
	}
	d.reserveExpiry(now)
}

func (d *Decider) reserveExpiry(now time.Time) {
	if d.eng.ReserveActive() && now.After(d.reserveUntil) {
		d.eng.SetReserveActive(false)
	}
}

// drainQueue answers every waiting request with err (leadership lost).
// d.mu held.
func (d *Decider) drainQueue(err error) {
	if d.fq == nil {
		return
	}
	d.fq.Dispatch(0, func(it *flow.Item[*waiter]) flow.Verdict {
		it.Value.done <- admitted{err: err}
		return flow.Dropped
	})
}

// charge corrects a tenant's served tokens by what its request really
// cost: its completion tokens, and its prompt tokens less what was charged
// at dispatch. d.mu held.
func (d *Decider) charge(t *Ticket, o Outcome) {
	if d.fq == nil || t.tenant == "" || !o.Delivered {
		return
	}
	var tokens int64
	if o.PromptTokens > 0 {
		tokens += int64(o.PromptTokens) - t.cost
	}
	if o.CompletionTokens > 0 {
		tokens += int64(o.CompletionTokens)
	}
	if tokens != 0 {
		d.fq.ChargeSince(t.tenant, tokens, t.epoch)
	}
}

// QueueItem is one waiting request, for status pages.
type QueueItem struct {
	Tenant, Label string
	Priority      int
	Waited        time.Duration
	Bytes         int64
}

// QueueStatus is the queue as it stands.
type QueueStatus struct {
	Items []QueueItem // in dispatch order as the queue stands
	Bytes int64
	// Served is each backlogged tenant's weighted tokens served.
	Served map[string]float64
}

// Queue lists the waiting requests in the order they would be offered.
func (d *Decider) Queue() QueueStatus {
	t := d.lock()
	defer d.unlock(OpRead, t)
	s := QueueStatus{Served: map[string]float64{}}
	if d.fq == nil {
		return s
	}
	now := d.o.Now()
	s.Bytes = d.fq.Bytes()
	d.fq.Each(func(it *flow.Item[*waiter]) {
		w := it.Value
		s.Items = append(s.Items, QueueItem{Tenant: w.adm.Tenant, Label: w.adm.Label, Priority: w.adm.Priority, Waited: now.Sub(w.arrival), Bytes: it.Bytes})
		s.Served[w.adm.Tenant] = d.fq.Served(w.adm.Tenant)
	})
	return s
}

// ObserveEngine hands the engine's reported load of url to the learned
// concurrency (engine.ObserveEngine); a raised limit dispatches waiting
// requests at once. It returns the learned limit before and after.
func (d *Decider) ObserveEngine(url string, l engine.EngineLoad) (before, after int) {
	t := d.lock()
	defer d.unlock(OpAdmin, t)
	return d.eng.ObserveEngine(url, l)
}

// SetLearnedConcurrency installs a limit learned elsewhere (a data plane
// takes the leader's from Sync).
func (d *Decider) SetLearnedConcurrency(url string, n int) {
	t := d.lock()
	defer d.unlock(OpAdmin, t)
	d.eng.SetLearnedConcurrency(url, n)
}

// Concurrency is url's limit in force (engine.Concurrency).
func (d *Decider) Concurrency(url string) (limit int, learned bool) {
	t := d.lock()
	defer d.unlock(OpRead, t)
	return d.eng.Concurrency(url)
}

// Concurrencies maps each worker to its concurrency limit in force
// (declared or learned; 0 unknown), read in one lock hold.
func (d *Decider) Concurrencies() map[string]int {
	t := d.lock()
	defer d.unlock(OpRead, t)
	ws := d.eng.Workers()
	out := make(map[string]int, len(ws))
	for _, w := range ws {
		out[w.URL], _ = d.eng.Concurrency(w.URL)
	}
	return out
}

// QueueLen is the number of requests waiting.
func (d *Decider) QueueLen() int {
	t := d.lock()
	defer d.unlock(OpRead, t)
	return d.fq.Len()
}
