package decider

import (
	"errors"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/flow"
	"github.com/cartrouter/cart/controlplane/index"
)

// Options configure a Decider.
type Options struct {
	Policy engine.Policy
	// MaxEntries bounds the prefix index; maintenance trims to it.
	MaxEntries int
	// Headroom is how far the index may grow past MaxEntries between
	// maintenance passes (0: MaxEntries/8). Past half of it Run starts a
	// pass at once instead of waiting for its interval (see pressure).
	Headroom int
	// InlineEvict: no periodic pass runs, the index evicts as it inserts.
	InlineEvict bool
	// PresizeIndex allocates the index's hash table for its bound up
	// front (index.Options.Presize), so it never grows under the routing
	// lock: control-plane nodes and the all-in-one router.
	PresizeIndex bool
	// DailyReset clears the index once a day at ResetHourUTC (0-23).
	DailyReset   bool
	ResetHourUTC int
	// Rand is the engine's tie-break source (nil: randomly seeded).
	Rand *rand.Rand
	// Now is the decision clock (nil: time.Now).
	Now func() time.Time

	// LoadLease is how long a data plane's Sync counts on a control-plane
	// leader; it also bounds how long a decision its data plane no longer
	// counts stays unsettled.
	LoadLease time.Duration
	// MaxTickets caps unsettled tracked decisions (0: DefaultMaxTickets).
	MaxTickets int
	// Flow configures the queue in front of a saturated pool (flow.go).
	Flow FlowOptions
}

// Decider is the routing core: see the package comment.
type Decider struct {
	mu  sync.Mutex
	eng *engine.Engine
	o   Options

	lastReset time.Time // guarded by mu
	ceiling   int       // the index's bound (index.Ceiling), which never changes

	lead leaderState // guarded by mu

	// pressure asks Run for a maintenance pass now: the index grew past
	// highWater. Without it, an index that fills its headroom a second
	// after a pass skips every new block until the next one (a minute by
	// default): at 5,000 routes/s of new prompts it filled in half a
	// second and then stopped learning. nil with InlineEvict.
	pressure  chan struct{}
	highWater int
	kicked    atomic.Uint64 // passes that found the index past highWater
	// maintaining is set while a Maintain pass runs: the index is still
	// past highWater until the pass has evicted, and a kick then would
	// only start a second, empty pass.
	maintaining atomic.Bool

	dropped  [numDropCauses]atomic.Uint64
	rejected atomic.Uint64
	hold     holdMetrics

	// Flow control (flow.go), guarded by mu: the queue, the engine's
	// Freed count at the last dispatch pass, and until when the headroom
	// for high-priority traffic stays on.
	fq           *flow.Queue[*waiter]
	freedSeen    uint64
	reserveUntil time.Time
	fm           flowMetrics
}

// New builds a Decider with an empty index and no workers.
func New(o Options) *Decider {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Rand == nil {
		o.Rand = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	if o.Headroom <= 0 {
		o.Headroom = o.MaxEntries / 8
	}
	if o.MaxTickets <= 0 {
		o.MaxTickets = DefaultMaxTickets
	}
	idx := index.New(index.Options{MaxEntries: o.MaxEntries, Headroom: o.Headroom, InlineEvict: o.InlineEvict, Presize: o.PresizeIndex})
	d := &Decider{eng: engine.New(o.Policy, idx, o.Rand), o: o, lastReset: o.Now(), ceiling: idx.Ceiling()}
	if !o.InlineEvict {
		d.pressure = make(chan struct{}, 1)
		d.highWater = max(o.MaxEntries, 1) + o.Headroom/2
	}
	d.lead.init()
	d.hold.init()
	d.initFlow()
	return d
}

// Request is one routing question.
type Request struct {
	engine.Request
	// PinTo restricts the decision to one worker (the holder of a stored
	// Responses API response); ErrPinnedGone when it left the pool.
	PinTo string
}

// Decision is where a request goes, and the ticket that settles it.
type Decision struct {
	engine.Decision
	// Pinned: the decision followed Request.PinTo.
	Pinned bool
	Ticket Ticket
	// PrefillTicket settles the prefill leg of a split decision
	// (Decision.Prefill): its own load on its own worker, and the
	// prompt's placement. The zero Ticket for a whole decision.
	PrefillTicket Ticket
	// Waited is how long the request waited in the flow-control queue
	// for a worker with room (0: it did not wait).
	Waited time.Duration
	// QueueDepth is how many requests were waiting in the flow-control
	// queue when the decision was made (a request dispatched from it
	// counts itself): while it is not 0, every completion frees room a
	// waiting request needs at once, so a data plane reports completions
	// without batching them.
	QueueDepth int
}

// Ticket is a decision's claim to settle: the unit of load it took on
// Worker and the blocks it newly placed there. Exactly one Settle (or, for
// a control-plane leader's tracked tickets, one completion) per non-dry-run
// decision.
type Ticket struct {
	// ID numbers a control-plane leader's tracked tickets; data planes
	// send it back in Complete. 0 for tickets their holder settles in
	// process, and for decisions no decider made (a data plane's local
	// fallback).
	ID uint64
	// Worker took the decision's load.
	Worker string

	issuer    *Decider
	placed    []uint64
	at        time.Time
	keyLen    int
	predicted int   // characters the index predicted cached
	placedAgo int64 // age of that prediction, ns
	// tenant and cost: the flow-control tenant charged for the request,
	// and the tokens charged at dispatch (flow.go); epoch the tenant's
	// lift number then (flow.Queue.ChargeSince).
	tenant string
	cost   int64
	epoch  uint64
}

// Outcome is what happened to a routed request.
type Outcome struct {
	// Delivered is false when the worker never processed the request
	// (connection failure, retryable rejection): the placement is withdrawn
	// so the index has no phantom holder.
	Delivered bool
	// PromptTokens and CachedTokens come from the worker's usage report
	// when it sent one (-1 when unknown). CachedTokens is -1 too when the
	// report has no cache fields: unknown, never "nothing cached".
	PromptTokens int
	CachedTokens int
	// CompletionTokens is the output the worker reported (-1 or 0 when
	// unknown), charged to the request's tenant by flow control.
	CompletionTokens int
}

// ErrNoCapacity marks the "no worker can take this" answers (no workers,
// none healthy, all excluded, all at max_load): hosts pass them on as 503,
// not as a failure to decide.
var ErrNoCapacity = errors.New("no worker available")

// ErrForeignTicket: Settle was handed a ticket this decider did not issue
// (a zero ticket, another decider's, a remote one). Counted in
// cart_decider_rejected_tickets_total instead of silently ignored.
var ErrForeignTicket = errors.New("ticket not issued by this decider")

type capacityError struct{ err error }

func (e *capacityError) Error() string   { return e.err.Error() }
func (e *capacityError) Unwrap() []error { return []error{e.err, ErrNoCapacity} }

// capacity marks the engine's capacity errors as ErrNoCapacity, keeping
// the specific message and error.
func capacity(err error) error {
	switch {
	case errors.Is(err, engine.ErrNoWorkers), errors.Is(err, engine.ErrNoHealthy),
		errors.Is(err, engine.ErrAllExcluded), errors.Is(err, engine.ErrAllSaturated):
		return &capacityError{err}
	}
	return err
}

// Decide decides req and takes one unit of load on the chosen worker. The
// caller settles the decision with Settle(d.Ticket, ...).
func (d *Decider) Decide(req Request) (Decision, error) {
	t := d.lock()
	now := d.o.Now()
	dec, err := d.choose(req, now)
	d.unlock(OpRoute, t)
	if err != nil {
		return Decision{}, err
	}
	dec.ownPlaced()
	return dec, nil
}

// ownPlaced gives the decision's tickets their own copies of the blocks
// they placed: Placed points into the caller's hash buffer, which may be
// pooled and reused once the request is over; a ticket must not depend on
// it.
func (dec *Decision) ownPlaced() {
	dec.Ticket.placed = slices.Clone(dec.Placed)
	if dec.Prefill != nil {
		dec.PrefillTicket.placed = slices.Clone(dec.Prefill.Placed)
	}
}

// Split reports whether the decision has a prefill leg.
func (dec *Decision) Split() bool { return dec.Prefill != nil }

// choose is one decision under the lock.
func (d *Decider) choose(req Request, now time.Time) (Decision, error) {
	pinned := false
	if req.PinTo != "" {
		if _, known := d.eng.WorkerIDOf(req.PinTo); !known {
			return Decision{}, &PinnedGoneError{Worker: req.PinTo}
		}
		// The response lives on that worker only: load and prefix do not
		// matter, every other worker is excluded.
		ex := slices.Clone(req.Exclude)
		for _, w := range d.eng.Workers() {
			if w.URL != req.PinTo {
				ex = append(ex, w.URL)
			}
		}
		req.Exclude, pinned = ex, true
		// Whatever its role: a stored response is served whole by the
		// worker holding it.
		req.AnyRole, req.Disagg = true, engine.DisaggNone
	}
	ed, err := d.eng.Choose(req.Request, now.UnixNano())
	if err != nil {
		return Decision{}, capacity(err)
	}
	dec := Decision{Decision: ed, Pinned: pinned, Ticket: Ticket{
		Worker: ed.Worker, issuer: d, placed: ed.Placed, at: now,
		keyLen: req.KeyLen, predicted: ed.ChosenChars, placedAgo: ed.PlacedAgo,
	}, QueueDepth: d.fq.Len()}
	if p := ed.Prefill; p != nil {
		dec.PrefillTicket = Ticket{Worker: p.Worker, issuer: d, placed: p.Placed, at: now,
			keyLen: req.KeyLen, predicted: p.ChosenChars, placedAgo: p.PlacedAgo}
		// The decode leg computes no prompt (it pulls the blocks): its
		// usage says nothing of the cache CART predicted, which is the
		// prefill leg's. keyLen 0 keeps it out of the closed loop.
		dec.Ticket.keyLen = 0
	}
	return dec, nil
}

// drop takes back an untracked decision nobody will use: its load
// released and its placement withdrawn, on each of its legs. d.mu held.
func (d *Decider) drop(dec Decision) {
	d.eng.Release(dec.Worker)
	d.eng.Unplace(dec.Decision)
	if p := dec.Prefill; p != nil {
		d.eng.Release(p.Worker)
		d.eng.Unplace(*p)
	}
}

// PinnedGoneError: the worker a request was pinned to has left the pool.
type PinnedGoneError struct{ Worker string }

func (e *PinnedGoneError) Error() string {
	return "the worker that produced this response (" + e.Worker + ") is no longer in the pool"
}

// Settle releases an in-process decision's load and settles its placement:
// withdrawn when the request was not delivered, its usage fed back to the
// closed loop when it was.
func (d *Decider) Settle(t Ticket, o Outcome) error {
	if t.issuer != d || t.ID != 0 {
		d.rejected.Add(1)
		return ErrForeignTicket
	}
	at := d.lock()
	d.eng.Release(t.Worker)
	d.settleIndex(&t, o)
	d.charge(&t, o)
	d.unlock(OpSettle, at)
	return nil
}

// settleIndex is the index side of settling: an undelivered request's
// placement is withdrawn (and the withdrawal queued for replication), a
// delivered one's usage feeds the closed loop. d.mu held.
func (d *Decider) settleIndex(t *Ticket, o Outcome) {
	if !o.Delivered {
		if len(t.placed) == 0 {
			return
		}
		d.eng.Unplace(engine.Decision{Worker: t.Worker, Placed: t.placed})
		if d.lead.ledger != nil {
			// The decision's time, so that undoing this withdrawal (if it
			// never commits) restores the placement as it was.
			d.lead.ledger.Unplace(d.eng, t.Worker, t.placed, t.at)
		}
		return
	}
	if o.PromptTokens > 0 && o.CachedTokens >= 0 {
		d.eng.Feedback(t.Worker, t.keyLen, t.predicted, t.placedAgo, o.PromptTokens, o.CachedTokens)
	}
}

// Rejected counts Settle calls refused with ErrForeignTicket.
func (d *Decider) Rejected() uint64 { return d.rejected.Load() }

// Do runs fn inside the decider's critical section, timed as op. It is for
// the state machine and the placement ledger, whose own state changes
// together with the index; fn must not keep e past its return, block, or
// call back into the decider.
func (d *Decider) Do(op Op, fn func(e *engine.Engine)) {
	t := d.lock()
	defer d.unlock(op, t)
	fn(d.eng)
}

// Steps runs step inside the critical section, one lock hold per call,
// until it reports done: for work over the whole index that must not stall
// routing (eviction, purges, a snapshot's install). Between two holds it
// yields, so that a decision waiting for the lock takes it then: Go's mutex
// hands over to a waiter only once it has waited 1 ms, and the next step
// would otherwise take the lock straight back.
func (d *Decider) Steps(op Op, step func(e *engine.Engine) (done bool)) {
	for {
		t := d.lock()
		done := step(d.eng)
		d.unlock(op, t)
		if done {
			return
		}
		runtime.Gosched()
	}
}

// Workers lists the workers with their live load and health.
func (d *Decider) Workers() []engine.WorkerState {
	t := d.lock()
	defer d.unlock(OpRead, t)
	return d.eng.Workers()
}

// KVStates maps each worker to what its engine's KV events say about its
// cache (the zero KVState when no events drive it), read in the same
// critical section as Workers would be so a status page sees one moment.
func (d *Decider) KVStates() map[string]engine.KVState {
	t := d.lock()
	defer d.unlock(OpRead, t)
	live := d.eng.Workers()
	kv := make(map[string]engine.KVState, len(live))
	for _, w := range live {
		kv[w.URL] = d.eng.KV(w.URL)
	}
	return kv
}

// SetWorkers replaces the worker set, keeping kept workers' load, health
// and cache entries.
func (d *Decider) SetWorkers(specs []engine.WorkerSpec) (removed []string) {
	t := d.lock()
	removed = d.eng.SetWorkers(specs)
	d.unlock(OpAdmin, t)
	if len(removed) > 0 {
		d.Purge()
	}
	return removed
}

// Purge drops removed workers' holdings from the index now, in short lock
// holds (the engine retires a removed worker in O(1); the maintenance pass
// would purge it later otherwise).
func (d *Decider) Purge() {
	d.Steps(OpMaintain, func(e *engine.Engine) bool { return e.PurgeStep(maintainChunk) })
}

// SetHealthy records a health-check verdict.
func (d *Decider) SetHealthy(url string, healthy bool) {
	t := d.lock()
	defer d.unlock(OpAdmin, t)
	d.eng.SetHealthy(url, healthy)
}

// SetDraining takes a worker out of new decisions (or puts it back).
func (d *Decider) SetDraining(url string, draining bool) {
	t := d.lock()
	defer d.unlock(OpAdmin, t)
	d.eng.SetDraining(url, draining)
}

// WorkerSource returns the source of the worker at url, and whether it
// is in the set: health probes and model fetches send the pool's worker
// key only to workers of the sources trusted with it.
func (d *Decider) WorkerSource(url string) (string, bool) {
	t := d.lock()
	defer d.unlock(OpRead, t)
	return d.eng.SourceOf(url)
}

// Load is a worker's in-flight count.
func (d *Decider) Load(url string) int {
	t := d.lock()
	defer d.unlock(OpRead, t)
	return d.eng.Load(url)
}

// IndexStats reports the index counters plus the engine's load-underflow
// guard.
func (d *Decider) IndexStats() (index.Stats, uint64) {
	t := d.lock()
	defer d.unlock(OpRead, t)
	return d.eng.Index().Stats(), d.eng.Underflows
}

// Stats is a summary for status pages and gauges.
type Stats struct {
	Workers, HealthyWorkers int
	IndexEntries            int
	// IndexEvicted and IndexSkipped are the index's counters since start
	// (index.Stats).
	IndexEvicted, IndexSkipped uint64
	// DataPlanes with a live load lease and Unsettled tracked tickets
	// (control-plane leader only).
	DataPlanes, Unsettled int
}

// Stats reads the summary in one lock hold.
func (d *Decider) Stats() Stats {
	t := d.lock()
	defer d.unlock(OpRead, t)
	var s Stats
	for _, w := range d.eng.Workers() {
		s.Workers++
		if w.Healthy {
			s.HealthyWorkers++
		}
	}
	is := d.eng.Index().Stats()
	s.IndexEntries, s.IndexEvicted, s.IndexSkipped = is.Entries, is.Evicted, is.SkippedInserts
	s.DataPlanes, s.Unsettled = len(d.lead.dps), len(d.lead.tickets)
	return s
}
