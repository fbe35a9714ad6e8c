package flow

import (
	"errors"
	"fmt"
	"slices"
)

// Limits bound the queue. Zero fields are unbounded.
type Limits struct {
	MaxItems          int   // requests waiting, all tenants
	MaxBytes          int64 // bytes of waiting requests' bodies, all tenants
	MaxItemsPerTenant int
	MaxBytesPerTenant int64
	// MaxTenants bounds the fairness counters kept for tenants that have
	// nothing queued (least recently active first out); 0 = 4096.
	MaxTenants int
	// ScanPerTenant bounds how many of one tenant's items Dispatch offers
	// in a pass before moving to the next tenant (0 = 8): an item that no
	// worker with room can take (another model) does not hide the next
	// one, while one pass stays bounded.
	ScanPerTenant int
	// ReturnCredit is how far behind the virtual time a tenant that was
	// idle may start, in requests the size of the one it brings (0: none
	// beyond the one request the virtual time gives). It lets a returning
	// tenant's burst go before the backlogged tenants' next requests, as a
	// waking task's sleeper credit does in Linux's CFS; a tenant whose
	// counter is above that point was not under its share and gains
	// nothing, so over time no tenant is served past its share.
	ReturnCredit int
}

// Item is one waiting request. The host fills the exported fields before
// Push and must not change them while the item is queued.
type Item[T any] struct {
	Tenant   string
	Priority int
	// Weight scales the tenant's share (tokens served count 1/Weight);
	// 0 means 1. The first item of a tenant sets it.
	Weight float64
	// Deadline orders the tenant's items (earliest first); the host sets
	// it to the request's own deadline or, without one, its queue timeout.
	Deadline int64
	Bytes    int64
	// Cost is the tokens the request is expected to be served (its prompt
	// tokens, estimated), charged to the tenant when it is dispatched;
	// Charge corrects it when the real figures are known.
	Cost  int64
	Value T

	seq    uint64
	queued bool
}

// Queued reports whether the item is still waiting.
func (it *Item[T]) Queued() bool { return it.queued }

// ErrFull is returned by Push when a bound would be exceeded.
type ErrFull struct {
	Scope string // "queue" or "tenant"
	What  string // "requests" or "bytes"
	Limit int64
}

func (e *ErrFull) Error() string {
	return fmt.Sprintf("the %s's wait queue is full (%d %s)", e.Scope, e.Limit, e.What)
}

// ErrDuplicate: Push of an item already queued.
var ErrDuplicate = errors.New("item already queued")

// Verdict is what Dispatch's callback did with an item.
type Verdict uint8

const (
	// Skip: no worker with room can take this item now; it keeps its place.
	Skip Verdict = iota
	// Taken: the item was bound to a worker; it leaves the queue and its
	// Cost is charged to its tenant.
	Taken
	// Dropped: the item cannot be served at all (no worker serves it any
	// more); it leaves the queue uncharged, and the host answers it.
	Dropped
	// Stop: no worker has room for anything; the item keeps its place and
	// the pass ends.
	Stop
)

type tenant[T any] struct {
	name    string
	band    *band[T]
	items   []*Item[T] // ordered by (Deadline, seq)
	bytes   int64
	counter *counter
}

// counter is a tenant's virtual token counter, kept across bands and
// across the times it has nothing queued (until pruned).
type counter struct {
	name    string
	served  float64 // weighted tokens
	weight  float64
	queued  int   // items queued in any band
	touched int64 // Dispatch pass of the last change, for pruning
	// lifted is the queue's lift number of the counter's last lift (0:
	// never lifted) and absorb what of that lift is left to absorb the
	// charges of requests dispatched before it (ChargeSince).
	lifted uint64
	absorb float64
}

type band[T any] struct {
	priority int
	tenants  map[string]*tenant[T] // backlogged tenants only
}

// Queue is the wait queue. The zero value is not usable; call New.
type Queue[T any] struct {
	lim      Limits
	bands    []*band[T] // highest priority first; only bands with items
	counters map[string]*counter
	n        int
	bytes    int64
	seq      uint64
	pass     int64
	lifts    uint64 // lifts so far, numbering each counter's last one
	// vtime is the scheduler's virtual time: the largest counter a
	// request started at (before its cost was added), as start-time fair
	// queuing defines it. A tenant that becomes backlogged starts from it.
	vtime float64
}

// New returns an empty queue with bounds lim.
func New[T any](lim Limits) *Queue[T] {
	if lim.MaxTenants <= 0 {
		lim.MaxTenants = 4096
	}
	if lim.ScanPerTenant <= 0 {
		lim.ScanPerTenant = 8
	}
	return &Queue[T]{lim: lim, counters: map[string]*counter{}}
}

// Len is the number of waiting items.
func (q *Queue[T]) Len() int { return q.n }

// Bytes is the body bytes of waiting items.
func (q *Queue[T]) Bytes() int64 { return q.bytes }

// SetLimits replaces the bounds; items already queued stay.
func (q *Queue[T]) SetLimits(lim Limits) {
	if lim.MaxTenants <= 0 {
		lim.MaxTenants = 4096
	}
	if lim.ScanPerTenant <= 0 {
		lim.ScanPerTenant = 8
	}
	q.lim = lim
}

// Push queues it, or refuses it with *ErrFull when a bound would be
// exceeded.
func (q *Queue[T]) Push(it *Item[T]) error {
	if it.queued {
		return ErrDuplicate
	}
	l := q.lim
	if l.MaxItems > 0 && q.n+1 > l.MaxItems {
		return &ErrFull{"queue", "requests", int64(l.MaxItems)}
	}
	if l.MaxBytes > 0 && q.bytes+it.Bytes > l.MaxBytes {
		return &ErrFull{"queue", "bytes", l.MaxBytes}
	}
	b := q.band(it.Priority)
	t := b.tenants[it.Tenant]
	if t != nil {
		if l.MaxItemsPerTenant > 0 && len(t.items)+1 > l.MaxItemsPerTenant {
			return &ErrFull{"tenant", "requests", int64(l.MaxItemsPerTenant)}
		}
		if l.MaxBytesPerTenant > 0 && t.bytes+it.Bytes > l.MaxBytesPerTenant {
			return &ErrFull{"tenant", "bytes", l.MaxBytesPerTenant}
		}
	} else if l.MaxBytesPerTenant > 0 && it.Bytes > l.MaxBytesPerTenant {
		return &ErrFull{"tenant", "bytes", l.MaxBytesPerTenant}
	}
	if t == nil {
		t = &tenant[T]{name: it.Tenant, band: b, counter: q.counterFor(it.Tenant, it.Weight)}
		// A tenant that was idle does not bank credit: it is lifted to
		// where the last request started (start-time fair queuing's
		// virtual time), or to the least counter of the band's backlogged
		// tenants if that is lower. Starting where the last request
		// started rather than where the backlogged tenants' counters now
		// stand (past that request's cost) lets the request it brings go
		// before their next one: a returning tenant is one request ahead
		// at most, however long it was idle; ReturnCredit more requests
		// of the size of the one it brings. One still waiting at another
		// priority was not idle, and its counter is that band's too.
		to := q.vtime
		if lo, ok := b.least(); ok && lo < to {
			to = lo
		}
		to -= float64(q.lim.ReturnCredit) * float64(it.Cost) / t.counter.weight
		if t.counter.queued == 0 && t.counter.served < to {
			q.lifts++
			t.counter.absorb, t.counter.served, t.counter.lifted = to-t.counter.served, to, q.lifts
		}
		b.tenants[it.Tenant] = t
		if len(b.tenants) == 1 {
			q.insertBand(b)
		}
	}
	q.seq++
	it.seq, it.queued = q.seq, true
	i, _ := slices.BinarySearchFunc(t.items, it, cmpItem[T])
	t.items = slices.Insert(t.items, i, it)
	t.bytes += it.Bytes
	t.counter.queued++
	q.n++
	q.bytes += it.Bytes
	return nil
}

func cmpItem[T any](a, b *Item[T]) int {
	switch {
	case a.Deadline < b.Deadline:
		return -1
	case a.Deadline > b.Deadline:
		return 1
	case a.seq < b.seq:
		return -1
	case a.seq > b.seq:
		return 1
	}
	return 0
}

// Remove takes a waiting item out (its caller gave up: a client gone, a
// timeout) and reports whether it was queued.
func (q *Queue[T]) Remove(it *Item[T]) bool {
	if !it.queued {
		return false
	}
	b := q.findBand(it.Priority)
	t := b.tenants[it.Tenant]
	i, found := slices.BinarySearchFunc(t.items, it, cmpItem[T])
	if !found || t.items[i] != it {
		panic("flow: queued item not found in its tenant's queue")
	}
	q.unlink(b, t, i)
	return true
}

// unlink removes t.items[i] from the queue.
func (q *Queue[T]) unlink(b *band[T], t *tenant[T], i int) {
	it := t.items[i]
	t.items = slices.Delete(t.items, i, i+1)
	it.queued = false
	t.bytes -= it.Bytes
	t.counter.queued--
	t.counter.touched = q.pass
	q.n--
	q.bytes -= it.Bytes
	if len(t.items) == 0 {
		delete(b.tenants, t.name)
		if len(b.tenants) == 0 {
			q.bands = slices.DeleteFunc(q.bands, func(x *band[T]) bool { return x == b })
		}
	}
}

// Started tells the queue that a request of tenant started without
// waiting (a worker had room): the virtual time moves to its counter as it
// does for one dispatched from the queue, so a tenant returning after the
// pool was last saturated starts level with those served since, not with
// credit for their usage meanwhile. A tenant without a counter is ignored.
func (q *Queue[T]) Started(tenantName string) {
	if c := q.counters[tenantName]; c != nil {
		q.vtime = max(q.vtime, c.served)
	}
}

// Epoch is tenant's lift number now: a request dispatched now keeps it, so
// that its usage report is charged by ChargeSince as what it is.
func (q *Queue[T]) Epoch(tenantName string) uint64 {
	if c := q.counters[tenantName]; c != nil {
		return c.lifted
	}
	return 0
}

// ChargeSince adds tokens (negative to correct an estimate) to tenant's
// served count for a request dispatched at lift number epoch: its
// completion tokens and its real prompt tokens once the worker reported
// them. A tenant without a counter any more is not charged.
//
// A request dispatched before the tenant's last lift was served before
// it, and the lift already counted the tenant as served up to the virtual
// time: its report fills what the lift added before it adds to the
// counter. Otherwise, when an idle tenant returns, the report of its
// previous request (finishing while it waits) would put it behind the
// tenants it was just lifted to start level with, costing it the next free
// slot.
func (q *Queue[T]) ChargeSince(tenantName string, tokens int64, epoch uint64) {
	c := q.counters[tenantName]
	if c == nil {
		return
	}
	w := float64(tokens) / c.weight
	if epoch != c.lifted {
		if w > 0 {
			a := min(w, c.absorb)
			c.absorb -= a
			w -= a
		} else {
			// Less was served before the lift than charged: the lift
			// still holds, with more of it left to absorb.
			c.absorb -= w
			w = 0
		}
	}
	c.served += w
	if c.served < 0 {
		c.served = 0
	}
}

// Served is tenant's weighted tokens served as the scheduler counts them
// (0 for a tenant it does not know).
func (q *Queue[T]) Served(tenantName string) float64 {
	if c := q.counters[tenantName]; c != nil {
		return c.served
	}
	return 0
}

// Dispatch offers waiting items to try in policy order until try says
// Stop, nothing more is taken in a whole pass, or maxTries offers were
// made (0: no bound), and returns the items taken and dropped.
func (q *Queue[T]) Dispatch(maxTries int, try func(*Item[T]) Verdict) (taken, dropped int) {
	return q.dispatch(maxTries, false, try)
}

// DispatchLast is Dispatch in the reverse of the policy's order between
// tenants: the lowest band first and in each band the most-served tenant
// first (each tenant's own items still in their order). It is for room
// that may not be real — a slot a worker's engine may make its request
// wait for in its own queue — which should go to the request the policy
// would serve last, not to the one it owes the next slot.
func (q *Queue[T]) DispatchLast(maxTries int, try func(*Item[T]) Verdict) (taken, dropped int) {
	return q.dispatch(maxTries, true, try)
}

func (q *Queue[T]) dispatch(maxTries int, last bool, try func(*Item[T]) Verdict) (taken, dropped int) {
	q.pass++
	tries := 0
	for q.n > 0 {
		progressed := false
		bands := slices.Clone(q.bands)
		if last {
			slices.Reverse(bands)
		}
	bands:
		for _, b := range bands {
			tenants := b.byCounter()
			if last {
				slices.Reverse(tenants)
			}
			for _, t := range tenants {
				for i := 0; i < len(t.items) && i < q.lim.ScanPerTenant; {
					if maxTries > 0 && tries >= maxTries {
						return taken, dropped
					}
					tries++
					it := t.items[i]
					switch try(it) {
					case Stop:
						return taken, dropped
					case Skip:
						i++
						continue
					case Taken:
						q.vtime = max(q.vtime, t.counter.served)
						t.counter.served += float64(it.Cost) / t.counter.weight
						q.unlink(b, t, i)
						taken++
						progressed = true
						// The counters changed: the next item is chosen
						// afresh, from the first band in this order.
						break bands
					case Dropped:
						q.unlink(b, t, i)
						dropped++
						progressed = true
					}
				}
			}
		}
		if !progressed {
			break
		}
	}
	q.prune()
	return taken, dropped
}

// Each calls fn for every waiting item, highest band first, each band's
// tenants by counter, each tenant's items in order (for status pages).
func (q *Queue[T]) Each(fn func(*Item[T])) {
	for _, b := range q.bands {
		for _, t := range b.byCounter() {
			for _, it := range t.items {
				fn(it)
			}
		}
	}
}

// Depth is one (priority, tenant) pair's waiting items and bytes.
type Depth struct {
	Priority int
	Tenant   string
	Items    int
	Bytes    int64
	Served   float64
}

// Depths lists the backlogged (priority, tenant) pairs.
func (q *Queue[T]) Depths() []Depth {
	var out []Depth
	for _, b := range q.bands {
		for _, t := range b.byCounter() {
			out = append(out, Depth{Priority: b.priority, Tenant: t.name, Items: len(t.items), Bytes: t.bytes, Served: t.counter.served})
		}
	}
	return out
}

func (q *Queue[T]) band(priority int) *band[T] {
	if b := q.findBand(priority); b != nil {
		return b
	}
	return &band[T]{priority: priority, tenants: map[string]*tenant[T]{}}
}

func (q *Queue[T]) findBand(priority int) *band[T] {
	for _, b := range q.bands {
		if b.priority == priority {
			return b
		}
	}
	return nil
}

func (q *Queue[T]) insertBand(b *band[T]) {
	i, _ := slices.BinarySearchFunc(q.bands, b, func(x, y *band[T]) int { return y.priority - x.priority })
	q.bands = slices.Insert(q.bands, i, b)
}

func (q *Queue[T]) counterFor(name string, weight float64) *counter {
	c := q.counters[name]
	if c == nil {
		if weight <= 0 {
			weight = 1
		}
		c = &counter{name: name, weight: weight}
		q.counters[name] = c
	}
	c.touched = q.pass
	return c
}

// prune forgets the counters of idle tenants beyond MaxTenants, least
// recently active first. A forgotten tenant comes back lifted as any newly
// backlogged one (Push).
func (q *Queue[T]) prune() {
	if len(q.counters) <= q.lim.MaxTenants {
		return
	}
	var idle []*counter
	for _, c := range q.counters {
		if c.queued == 0 {
			idle = append(idle, c)
		}
	}
	slices.SortFunc(idle, func(a, b *counter) int {
		switch {
		case a.touched < b.touched:
			return -1
		case a.touched > b.touched:
			return 1
		}
		return 0
	})
	for _, c := range idle {
		if len(q.counters) <= q.lim.MaxTenants {
			break
		}
		delete(q.counters, c.name)
	}
}

// least is the least counter among the band's backlogged tenants.
func (b *band[T]) least() (float64, bool) {
	first, lo := true, 0.0
	for _, t := range b.tenants {
		if first || t.counter.served < lo {
			lo, first = t.counter.served, false
		}
	}
	return lo, !first
}

// byCounter lists the band's tenants by counter, then the most recently
// lifted first, then name (so that ties break the same way on every node
// and in every test).
func (b *band[T]) byCounter() []*tenant[T] {
	ts := make([]*tenant[T], 0, len(b.tenants))
	for _, t := range b.tenants {
		ts = append(ts, t)
	}
	slices.SortFunc(ts, func(x, y *tenant[T]) int {
		switch {
		case x.counter.served < y.counter.served:
			return -1
		case x.counter.served > y.counter.served:
			return 1
		// Equal counters: the tenant lifted last goes first. It was
		// lifted to start level with the other, whose requests running
		// meanwhile have served tokens not charged until they finish.
		case x.counter.lifted > y.counter.lifted:
			return -1
		case x.counter.lifted < y.counter.lifted:
			return 1
		case x.name < y.name:
			return -1
		case x.name > y.name:
			return 1
		}
		return 0
	})
	return ts
}
