package remote

import (
	"sync"
	"time"
)

// CauseCPBreaker is the fallback cause of decisions made locally because
// the control-plane breaker is open.
const CauseCPBreaker = "cp_breaker"

// cpBreaker stops Route calls to a control plane that keeps timing out or
// being unreachable. Without it every decision first waits out the whole
// route timeout before falling back, which adds that timeout to every
// request for as long as the leader stays slow. While open, one probe call
// per cool-off goes through, so recovery is seen within about a cool-off;
// after a call that failed at once (refused, no leader: nothing was waited
// for), the next probe goes after fastProbe instead, so that a new leader
// is found within about that much of its election.
//
// Failures count once per stall: a call that was already in flight when a
// failure was counted does not count again. A stall of the control plane
// (or of this host) longer than the route timeout makes every call in
// flight time out together; counted one by one, a single 20 ms hiccup at
// a few thousand routes/s opened the breaker and sent a whole cool-off of
// requests (1,250 per data plane at 5,000/s over four) to the fallback.
// Now the breaker opens only after failures rounds of calls, each started
// after the previous round failed: about failures × the route timeout of
// trouble.
type cpBreaker struct {
	failures int // consecutive failures that open it
	cooloff  time.Duration
	now      func() time.Time

	mu          sync.Mutex
	consecutive int
	round       uint64 // counted failures and resets so far; a call fails in the round it started in
	open        bool
	nextProbe   time.Time // while open: when the next probe may go
	probing     bool      // a probe is in flight
}

// fastProbe is the probe interval after a call that failed at once.
const fastProbe = 100 * time.Millisecond

// newCPBreaker returns nil (never open) when failures is not positive.
func newCPBreaker(failures int, cooloff time.Duration, now func() time.Time) *cpBreaker {
	if failures <= 0 {
		return nil
	}
	if cooloff <= 0 {
		cooloff = time.Second
	}
	if now == nil {
		now = time.Now
	}
	return &cpBreaker{failures: failures, cooloff: cooloff, now: now}
}

// cpCall is a call allow let through, as done needs to judge it.
type cpCall struct {
	probe bool   // the probe of an open breaker
	round uint64 // the breaker's round when the call started
}

// allow reports whether a Route call may go to the control plane; the
// call's outcome must be given to done with the cpCall.
func (b *cpBreaker) allow() (ok bool, c cpCall) {
	if b == nil {
		return true, c
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	c.round = b.round
	if !b.open {
		return true, c
	}
	now := b.now()
	if b.probing || now.Before(b.nextProbe) {
		return false, c
	}
	b.probing = true
	b.nextProbe = now.Add(b.cooloff)
	c.probe = true
	return true, c
}

// Outcomes of a Route call, as the breaker sees them.
const (
	cpAnswered = iota // any answer, errors such as ResourceExhausted included
	cpFailed          // timeout: the control plane did not answer in time
	cpRefused         // unavailable: refused before the deadline (no leader, node down)
	cpUnknown         // neither (the client left, another error): no verdict
)

// done records the outcome of a call that allow let through, and reports
// whether it closed the breaker.
func (b *cpBreaker) done(c cpCall, outcome int) (closed bool) {
	if b == nil {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	probe := c.probe
	if probe {
		b.probing = false
	}
	switch outcome {
	case cpAnswered:
		// Any answer, even from a call started before the breaker opened,
		// shows the control plane is answering in time again.
		closed = b.open
		b.consecutive, b.open = 0, false
	case cpFailed, cpRefused:
		if c.round == b.round {
			b.consecutive++
			b.round++
		}
		wait := b.cooloff
		if outcome == cpRefused {
			wait = min(wait, fastProbe)
		}
		if probe {
			b.nextProbe = b.now().Add(wait)
		}
		if !b.open && b.consecutive >= b.failures {
			b.open = true
			b.nextProbe = b.now().Add(wait)
		}
	}
	return closed
}

// reset closes the breaker: the control plane it judged is no longer the
// one called (a new leader).
func (b *cpBreaker) reset() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.consecutive, b.open = 0, false
	// Calls still in flight to the old control plane (a probe included)
	// fail against it, not against the new one.
	b.round++
}

// probeSoon lets the next call through as a probe, when the breaker is
// open: the control plane just answered something else (the Route
// stream's hello), and waiting out the cool-off would keep falling back
// for nothing.
func (b *cpBreaker) probeSoon() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open && !b.probing {
		b.nextProbe = b.now()
	}
}

// probeEvery is the interval of the probes while the breaker is open (0:
// no breaker).
func (b *cpBreaker) probeEvery() time.Duration {
	if b == nil {
		return 0
	}
	return b.cooloff
}

// isOpen reports whether Route calls are being skipped.
func (b *cpBreaker) isOpen() bool {
	if b == nil {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open
}
