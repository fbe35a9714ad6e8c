package remote

import (
	"sync"
	"sync/atomic"
)

// A data plane drops its connections to a control-plane node and dials
// afresh after as many rounds of Route calls in a row timed out on it as
// open the control-plane breaker (route_breaker_failures; redialAfter
// when the breaker is off), and again after as many failed probes.
//
// The HTTP/2 health check (cpclient: a PING after a second without a
// frame, the connection closed when it is not answered within another)
// finds a connection that stopped delivering. It cannot find one whose
// PINGs are answered while its calls are not: an HTTP/2 proxy between the
// data plane and the control plane answers PINGs itself, whatever became
// of its own connection behind. A fresh dial is then the one way to a
// working path. A stall too short to open the breaker is too short to
// drop connections for; a leader that is merely slow costs a handshake
// (and a Route stream reopened) every route_breaker_failures cool-offs.
const redialAfter = 5

// timeoutRun counts consecutive timeouts of Route calls to one
// control-plane node, once per stall as the breaker counts its failures
// (cpBreaker): a call in flight when a timeout was counted does not count
// again, so a stall that times out many calls together is one round.
type timeoutRun struct {
	after int           // rounds in a row that drop the connections
	round atomic.Uint64 // counted timeouts so far; a call times out in the round it started in

	mu     sync.Mutex
	target string
	n      int
}

// start returns the round a call starts in, for done.
func (t *timeoutRun) start() uint64 { return t.round.Load() }

// done records the outcome of a call to target started in round, and
// reports whether the connections to target should be dropped now.
func (t *timeoutRun) done(target string, round uint64, outcome int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if target != t.target {
		t.target, t.n = target, 0
	}
	switch outcome {
	case cpAnswered:
		t.n = 0
	case cpFailed:
		if !t.round.CompareAndSwap(round, round+1) {
			return false
		}
		if t.n++; t.n >= t.after {
			t.n = 0
			return true
		}
	}
	return false
}
