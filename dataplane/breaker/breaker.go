// Package breaker is a per-worker circuit breaker driven by real traffic.
//
// Closed: failures are counted; FailureThreshold consecutive failures open
// it. Open: the worker gets no traffic for Timeout. Half-open: trial
// requests go through; SuccessThreshold successes close it, one failure
// re-opens it. The clock is passed in, so the state machine is
// table-testable.
package breaker

import (
	"sync"
	"time"
)

// State of one worker's breaker.
type State int

// Breaker states; String gives their metric/JSON names.
const (
	Closed State = iota
	Open
	HalfOpen
)

func (s State) String() string {
	switch s {
	case Open:
		return "open"
	case HalfOpen:
		return "half_open"
	default:
		return "closed"
	}
}

// Config mirrors circuit_breaker.* in the configuration.
type Config struct {
	Enabled          bool
	FailureThreshold int
	SuccessThreshold int
	Timeout          time.Duration
}

// Transition is reported when a breaker changes state.
type Transition struct {
	Worker   string
	From, To State
}

type cb struct {
	state     State
	failures  int // consecutive, while closed
	successes int // while half-open
	trials    int // requests in flight to a half-open worker
	openedAt  time.Time
}

// Set holds the breakers of all workers. Safe for concurrent use; no lock
// is held across I/O (callers report outcomes after their I/O is done).
type Set struct {
	cfg      Config
	mu       sync.Mutex
	b        map[string]*cb
	onChange func(Transition) // called without the lock held
}

// NewSet returns a breaker set. onChange may be nil.
func NewSet(cfg Config, onChange func(Transition)) *Set {
	return &Set{cfg: cfg, b: make(map[string]*cb), onChange: onChange}
}

func (s *Set) get(w string) *cb {
	c, ok := s.b[w]
	if !ok {
		c = &cb{}
		s.b[w] = c
	}
	return c
}

// Allow reports whether worker w may receive a request at now. An open
// breaker whose timeout has passed moves to half-open and allows trials.
func (s *Set) Allow(w string, now time.Time) bool {
	if !s.cfg.Enabled {
		return true
	}
	s.mu.Lock()
	c := s.get(w)
	tr := s.expire(w, c, now)
	ok := c.state != Open
	s.mu.Unlock()
	s.notify(tr)
	return ok
}

// Blocked lists the workers whose breaker is open at now (moving those
// whose timeout has passed to half-open). It allocates only when some
// breaker is open, which keeps the healthy path cheap.
func (s *Set) Blocked(now time.Time) []string {
	if !s.cfg.Enabled {
		return nil
	}
	var out []string
	var trs []*Transition
	s.mu.Lock()
	for w, c := range s.b {
		if c.state == HalfOpen && c.trials >= max(1, s.cfg.SuccessThreshold) {
			out = append(out, w) // enough trials in flight already
			continue
		}
		if c.state != Open {
			continue
		}
		if tr := s.expire(w, c, now); tr != nil {
			trs = append(trs, tr)
			continue
		}
		out = append(out, w)
	}
	s.mu.Unlock()
	for _, tr := range trs {
		s.notify(tr)
	}
	return out
}

// Begin records that a request is being sent to w. While w is half-open
// it counts as a trial: once SuccessThreshold trials are in flight, Blocked
// keeps further traffic away until they report, so a still-sick replica is
// probed with a few requests instead of a whole burst. Every Begin must be
// followed by exactly one Success, Failure or Abandon.
func (s *Set) Begin(w string) {
	if !s.cfg.Enabled {
		return
	}
	s.mu.Lock()
	if c := s.get(w); c.state == HalfOpen {
		c.trials++
	}
	s.mu.Unlock()
}

// Abandon ends a request that says nothing about the worker (the client
// went away).
func (s *Set) Abandon(w string) {
	if !s.cfg.Enabled {
		return
	}
	s.mu.Lock()
	if c, ok := s.b[w]; ok {
		c.endTrial()
	}
	s.mu.Unlock()
}

// Success records a request that the worker served.
func (s *Set) Success(w string) {
	if !s.cfg.Enabled {
		return
	}
	s.mu.Lock()
	c := s.get(w)
	c.endTrial()
	var tr *Transition
	switch c.state {
	case Closed:
		c.failures = 0
	case HalfOpen:
		c.successes++
		if c.successes >= s.cfg.SuccessThreshold {
			tr = s.move(w, c, Closed)
		}
	}
	s.mu.Unlock()
	s.notify(tr)
}

// Failure records a request the worker failed (connection error or a
// retryable status). Client hang-ups must not be reported here.
func (s *Set) Failure(w string, now time.Time) {
	if !s.cfg.Enabled {
		return
	}
	s.mu.Lock()
	c := s.get(w)
	c.endTrial()
	var tr *Transition
	switch c.state {
	case Closed:
		c.failures++
		if c.failures >= s.cfg.FailureThreshold {
			tr = s.open(w, c, now)
		}
	case HalfOpen:
		tr = s.open(w, c, now)
	case Open:
		// A request that was already in flight when the breaker opened:
		// extend nothing, the timeout runs from the first opening.
	}
	s.mu.Unlock()
	s.notify(tr)
}

// StateAt returns w's state at now. An open breaker whose timeout has
// passed is moved to half-open first, as the next request would move it:
// otherwise a view such as /workers keeps showing "open" for a worker that
// recovered while no traffic flowed, though it would get the next request.
func (s *Set) StateAt(w string, now time.Time) State {
	if !s.cfg.Enabled {
		return Closed
	}
	s.mu.Lock()
	c, ok := s.b[w]
	if !ok {
		s.mu.Unlock()
		return Closed
	}
	tr := s.expire(w, c, now)
	st := c.state
	s.mu.Unlock()
	s.notify(tr)
	return st
}

// HealthRecovered moves w's open breaker to half-open: its health check
// has turned green again, which is better evidence than the time since the
// breaker opened, so trial requests may go at once.
func (s *Set) HealthRecovered(w string) {
	if !s.cfg.Enabled {
		return
	}
	s.mu.Lock()
	var tr *Transition
	if c, ok := s.b[w]; ok && c.state == Open {
		tr = s.move(w, c, HalfOpen)
	}
	s.mu.Unlock()
	s.notify(tr)
}

// State returns w's current state (without moving it to half-open).
func (s *Set) State(w string) State {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.b[w]; ok {
		return c.state
	}
	return Closed
}

// Forget drops the breakers of workers not in keep (after a reload).
func (s *Set) Forget(keep map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for w := range s.b {
		if !keep[w] {
			delete(s.b, w)
		}
	}
}

func (s *Set) move(w string, c *cb, to State) *Transition {
	tr := &Transition{Worker: w, From: c.state, To: to}
	c.state = to
	c.failures, c.successes, c.trials = 0, 0, 0
	return tr
}

// expire moves c to half-open if it is open and its timeout has passed at
// now; every reader that looks at an open breaker goes through here so that
// they agree on when the timeout ends.
func (s *Set) expire(w string, c *cb, now time.Time) *Transition {
	if c.state == Open && now.Sub(c.openedAt) >= s.cfg.Timeout {
		return s.move(w, c, HalfOpen)
	}
	return nil
}

// open moves c to open; the timeout runs from now.
func (s *Set) open(w string, c *cb, now time.Time) *Transition {
	tr := s.move(w, c, Open)
	c.openedAt = now
	return tr
}

// endTrial counts down a trial that reported; a request begun while the
// breaker was in another state (trials reset by move) finds none to end.
func (c *cb) endTrial() {
	if c.trials > 0 {
		c.trials--
	}
}

func (s *Set) notify(tr *Transition) {
	if tr != nil && s.onChange != nil {
		s.onChange(*tr)
	}
}
