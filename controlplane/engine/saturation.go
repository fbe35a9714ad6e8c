package engine

// ---- saturation ------------------------------------------------------------
//
// A worker is saturated when it cannot start one more request without
// queueing it in the engine: CART's in-flight count on it has reached its
// limit, the least of its max_load and its concurrency (declared as
// max_concurrency, or learned from the engine's own metrics, see
// ObserveEngine). A worker without either has no limit and is never
// saturated, which is CART's behaviour before flow control. When every
// worker a request may use is saturated, Route fails with ErrAllSaturated
// and the caller's flow control queues the request (controlplane/decider).
//
// Headroom: while traffic of priority >= Policy.ReservePriority is active
// (SetReserveActive), requests below it see every limit lowered by
// Policy.ReserveSlots, so a few slots per worker stay free for the
// high-priority traffic and it never waits behind a flood.

// limitFor is w's in-flight limit for a request of priority prio (0:
// none); noProbe leaves out the unconfirmed top slot of a probe.
func (e *Engine) limitFor(w *worker, prio int, noProbe bool) int {
	l := w.spec.MaxLoad
	c := w.spec.MaxConcurrency
	if c <= 0 {
		c = w.learned
		if noProbe && w.probing && c > 1 {
			c--
		}
	}
	if c > 0 && (l <= 0 || c < l) {
		l = c
	}
	if l > 0 && e.reserveActive && e.pol.ReserveSlots > 0 && prio < e.pol.ReservePriority {
		l = max(l-e.pol.ReserveSlots, 0)
		if l == 0 {
			return -1 // reserved whole: no room at all below the priority
		}
	}
	return l
}

// saturated reports whether w has no room for a request of priority prio
// (noProbe: not counting a probe's slot).
func (e *Engine) saturated(w *worker, prio int, noProbe bool) bool {
	l := e.limitFor(w, prio, noProbe)
	return l < 0 || l > 0 && w.load >= l
}

// SetReserveActive turns the headroom for high-priority traffic on or off
// (the decider turns it on while such traffic was seen recently).
func (e *Engine) SetReserveActive(on bool) {
	if e.reserveActive && !on {
		e.freed++ // low-priority requests may now use the reserved slots
	}
	e.reserveActive = on
}

// ReserveActive reports whether the headroom is in force.
func (e *Engine) ReserveActive() bool { return e.reserveActive }

// Freed counts the events that may have given a saturated worker room
// (a release, a worker back in service, a raised limit): a queue host
// that saw the same count after its last dispatch attempt knows that
// trying again would find nothing new.
func (e *Engine) Freed() uint64 { return e.freed }

// HasRoom reports whether any healthy, not draining worker has room for a
// request of priority prio (ignoring a request's own exclusions; noProbe:
// not counting a probe's slot): when none has, no queued request can be
// dispatched.
func (e *Engine) HasRoom(prio int, noProbe bool) bool {
	for _, w := range e.workers {
		if w.healthy && !w.draining && !e.saturated(w, prio, noProbe) {
			return true
		}
	}
	return false
}

// ProbeRoom reports whether a healthy, not draining worker has room that
// only a request without NoProbe may take: the top slot of a limit a probe
// just raised. Never while the headroom is held: the slot would go to the
// priority the reserve is for (and no probe starts then, ObserveEngine).
func (e *Engine) ProbeRoom() bool {
	if e.reserveActive {
		return false
	}
	for _, w := range e.workers {
		if w.healthy && !w.draining && w.probing && w.spec.MaxConcurrency <= 0 &&
			(w.spec.MaxLoad <= 0 || w.learned <= w.spec.MaxLoad) && w.load == w.learned-1 {
			return true
		}
	}
	return false
}

// EngineLoad is what a worker's engine reported in its metrics: requests
// it runs and requests waiting in its own queue.
type EngineLoad struct {
	Running, Waiting int
}

// GrowAfter is how many observations in a row of an engine running at its
// learned limit with nothing waiting it takes to try one more: often
// enough to follow an engine whose room grows (KV memory freed), rarely
// enough that a request sent past its real limit, which then waits in the
// engine's queue where priority and fairness no longer apply, is rare.
const GrowAfter = 30

// MaxGrowAfter bounds the back-off of probes that found no room: an
// engine whose batch limit is fixed (vLLM's --max-num-seqs) fails every
// probe, and each failure holds a request in its queue until the next read
// (the scraper reads again a tenth of an interval after a raise); the
// back-off makes that one probe in 961 reads instead of one in 31.
const MaxGrowAfter = GrowAfter << 5

// ObserveEngine learns url's concurrency from its engine's metrics, for a
// worker with no declared max_concurrency:
//   - the engine queued requests (Waiting > 0): it runs no more than
//     Running at once now, so that is the limit (at least 1);
//   - it queued nothing while running at least the limit, GrowAfter times
//     in a row with the headroom off: it may take more, so the limit grows
//     by one (a probe), whose slot only requests that allow it take
//     (Request.NoProbe) until an observation confirms or refutes it.
//
// A probe that ends with the engine queueing below the raised limit found
// no room: the next one waits twice as many observations, up to
// MaxGrowAfter; one the engine ran with nothing waiting found room, and
// the wait starts again from GrowAfter.
//
// Until the engine first queues, the limit stays unknown (no limit): an
// engine that never queued has never been saturated. It returns the
// learned limit before and after this observation (0: unknown).
func (e *Engine) ObserveEngine(url string, l EngineLoad) (before, after int) {
	w, ok := e.byURL[url]
	if !ok || w.spec.MaxConcurrency > 0 {
		return 0, 0
	}
	if w.growAfter == 0 {
		w.growAfter = GrowAfter
	}
	old := w.learned
	switch {
	case l.Waiting > 0:
		n := max(l.Running, 1)
		switch {
		case w.probing && n < w.learned:
			w.growAfter = min(2*w.growAfter, MaxGrowAfter)
		case w.probing:
			w.growAfter = GrowAfter // it runs the raised limit: room found
		}
		w.probing = false
		w.learned, w.atLimit = n, 0
	case w.learned > 0 && l.Running >= w.learned:
		if w.probing {
			w.probing, w.growAfter = false, GrowAfter
		}
		if e.reserveActive {
			// No probe while the headroom is held: the requests below
			// the reserve would take the raised limit's slot as theirs,
			// and a failed probe would leave a reserved slot that the
			// engine does not have.
			w.atLimit = 0
			break
		}
		if w.atLimit++; w.atLimit >= w.growAfter {
			w.learned, w.atLimit, w.probing = w.learned+1, 0, true
		}
	default:
		w.atLimit = 0
	}
	if w.learned > old {
		e.freed++
	}
	return old, w.learned
}

// Concurrency is url's concurrency limit in force: declared, else learned
// (0: unknown).
func (e *Engine) Concurrency(url string) (limit int, learned bool) {
	w, ok := e.byURL[url]
	if !ok {
		return 0, false
	}
	if w.spec.MaxConcurrency > 0 {
		return w.spec.MaxConcurrency, false
	}
	return w.learned, w.learned > 0
}

// SetLearnedConcurrency installs a learned limit (a data plane takes the
// leader's through Sync); 0 forgets it.
func (e *Engine) SetLearnedConcurrency(url string, n int) {
	if w, ok := e.byURL[url]; ok {
		if n > w.learned || n == 0 && w.learned > 0 {
			e.freed++
		}
		w.learned = max(n, 0)
	}
}
