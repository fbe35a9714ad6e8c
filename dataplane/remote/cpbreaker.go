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
type cpBreaker struct {
	failures int // consecutive failures that open it
	cooloff  time.Duration
	now      func() time.Time

	mu          sync.Mutex
	consecutive int
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

// allow reports whether a Route call may go to the control plane, and
// whether it is the probe of an open breaker (whose outcome must be given
// to done).
func (b *cpBreaker) allow() (ok, probe bool) {
	if b == nil {
		return true, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.open {
		return true, false
	}
	now := b.now()
	if b.probing || now.Before(b.nextProbe) {
		return false, false
	}
	b.probing = true
	b.nextProbe = now.Add(b.cooloff)
	return true, true
}

// Outcomes of a Route call, as the breaker sees them.
const (
	cpAnswered = iota // any answer, errors such as ResourceExhausted included
	cpFailed          // timeout: the control plane did not answer in time
	cpRefused         // unavailable: refused before the deadline (no leader, node down)
	cpUnknown         // neither (the client left, another error): no verdict
)

// done records the outcome of a call that allow let through.
func (b *cpBreaker) done(probe bool, outcome int) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe {
		b.probing = false
	}
	switch outcome {
	case cpAnswered:
		// Any answer, even from a call started before the breaker opened,
		// shows the control plane is answering in time again.
		b.consecutive, b.open = 0, false
	case cpFailed, cpRefused:
		b.consecutive++
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
