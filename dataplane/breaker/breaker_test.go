package breaker

import (
	"slices"
	"testing"
	"time"
)

// step is one event applied to worker "w" in a table test.
type step struct {
	op   string        // "fail", "ok", "allow", "blocked"
	at   time.Duration // clock offset for fail/allow/blocked
	want State         // state after the step
	// allow: the expected Allow result; blocked: whether "w" is listed.
	ok bool
}

func TestBreakerStateMachine(t *testing.T) {
	cfg := Config{Enabled: true, FailureThreshold: 3, SuccessThreshold: 2, Timeout: 10 * time.Second}
	cases := []struct {
		name  string
		steps []step
		trans []Transition // expected transitions of "w", in order
	}{
		{
			name: "closed until the threshold, open at it",
			steps: []step{
				{op: "fail", want: Closed},
				{op: "fail", want: Closed},
				{op: "allow", ok: true, want: Closed},
				{op: "fail", want: Open},
				{op: "allow", ok: false, want: Open},
			},
			trans: []Transition{{"w", Closed, Open}},
		},
		{
			name: "a success resets the consecutive failure count",
			steps: []step{
				{op: "fail", want: Closed},
				{op: "fail", want: Closed},
				{op: "ok", want: Closed},
				{op: "fail", want: Closed},
				{op: "fail", want: Closed},
				{op: "fail", want: Open},
			},
			trans: []Transition{{"w", Closed, Open}},
		},
		{
			name: "open blocks until the timeout, then half-open lets trials through",
			steps: []step{
				{op: "fail"}, {op: "fail"}, {op: "fail", want: Open},
				{op: "allow", at: 9 * time.Second, ok: false, want: Open},
				{op: "blocked", at: 9999 * time.Millisecond, ok: true, want: Open},
				{op: "allow", at: 10 * time.Second, ok: true, want: HalfOpen},
				{op: "allow", at: 10 * time.Second, ok: true, want: HalfOpen},
				{op: "blocked", at: 10 * time.Second, ok: false, want: HalfOpen},
			},
			trans: []Transition{{"w", Closed, Open}, {"w", Open, HalfOpen}},
		},
		{
			name: "success threshold successes in half-open close it",
			steps: []step{
				{op: "fail"}, {op: "fail"}, {op: "fail", want: Open},
				{op: "allow", at: 10 * time.Second, ok: true, want: HalfOpen},
				{op: "ok", want: HalfOpen},
				{op: "ok", want: Closed},
				// Closed again: the failure count starts from zero.
				{op: "fail", at: 11 * time.Second, want: Closed},
				{op: "fail", at: 11 * time.Second, want: Closed},
				{op: "allow", at: 11 * time.Second, ok: true, want: Closed},
			},
			trans: []Transition{{"w", Closed, Open}, {"w", Open, HalfOpen}, {"w", HalfOpen, Closed}},
		},
		{
			name: "one failure in half-open re-opens, with a fresh timeout",
			steps: []step{
				{op: "fail"}, {op: "fail"}, {op: "fail", want: Open},
				{op: "allow", at: 10 * time.Second, ok: true, want: HalfOpen},
				{op: "ok", want: HalfOpen},
				{op: "fail", at: 12 * time.Second, want: Open},
				// The timeout runs from the re-opening (12s), not the first opening.
				{op: "allow", at: 21 * time.Second, ok: false, want: Open},
				{op: "allow", at: 22 * time.Second, ok: true, want: HalfOpen},
			},
			trans: []Transition{{"w", Closed, Open}, {"w", Open, HalfOpen}, {"w", HalfOpen, Open}, {"w", Open, HalfOpen}},
		},
		{
			name: "Blocked moves an expired breaker to half-open",
			steps: []step{
				{op: "fail"}, {op: "fail"}, {op: "fail", want: Open},
				{op: "blocked", at: 5 * time.Second, ok: true, want: Open},
				{op: "blocked", at: 10 * time.Second, ok: false, want: HalfOpen},
			},
			trans: []Transition{{"w", Closed, Open}, {"w", Open, HalfOpen}},
		},
		{
			name: "failures of requests already in flight while open do not extend the timeout",
			steps: []step{
				{op: "fail"}, {op: "fail"}, {op: "fail", want: Open},
				{op: "fail", at: 9 * time.Second, want: Open},
				{op: "allow", at: 10 * time.Second, ok: true, want: HalfOpen},
			},
			trans: []Transition{{"w", Closed, Open}, {"w", Open, HalfOpen}},
		},
		{
			name: "successes while open change nothing",
			steps: []step{
				{op: "fail"}, {op: "fail"}, {op: "fail", want: Open},
				{op: "ok", want: Open},
				{op: "ok", want: Open},
				{op: "allow", at: time.Second, ok: false, want: Open},
			},
			trans: []Transition{{"w", Closed, Open}},
		},
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []Transition
			s := NewSet(cfg, func(tr Transition) { got = append(got, tr) })
			for i, st := range tc.steps {
				now := t0.Add(st.at)
				switch st.op {
				case "fail":
					s.Failure("w", now)
				case "ok":
					s.Success("w")
				case "allow":
					if ok := s.Allow("w", now); ok != st.ok {
						t.Fatalf("step %d: Allow = %v, want %v", i, ok, st.ok)
					}
				case "blocked":
					if listed := slices.Contains(s.Blocked(now), "w"); listed != st.ok {
						t.Fatalf("step %d: Blocked lists w = %v, want %v", i, listed, st.ok)
					}
				default:
					t.Fatalf("bad op %q", st.op)
				}
				if got := s.State("w"); got != st.want {
					t.Fatalf("step %d (%s at %v): state %s, want %s", i, st.op, st.at, got, st.want)
				}
			}
			if !slices.Equal(got, tc.trans) {
				t.Fatalf("transitions %v, want %v", got, tc.trans)
			}
		})
	}
}

func TestBreakerWorkersAreIndependent(t *testing.T) {
	s := NewSet(Config{Enabled: true, FailureThreshold: 1, SuccessThreshold: 1, Timeout: time.Minute}, nil)
	now := time.Now()
	s.Failure("a", now)
	if s.State("a") != Open || s.State("b") != Closed {
		t.Fatalf("a=%s b=%s", s.State("a"), s.State("b"))
	}
	if !s.Allow("b", now) || s.Allow("a", now) {
		t.Fatal("one worker's breaker affected another")
	}
	if got := s.Blocked(now); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("Blocked = %v, want [a]", got)
	}
}

func TestBreakerDisabledNeverBlocks(t *testing.T) {
	var calls int
	s := NewSet(Config{Enabled: false, FailureThreshold: 1, SuccessThreshold: 1, Timeout: time.Minute}, func(Transition) { calls++ })
	now := time.Now()
	for range 10 {
		s.Failure("a", now)
	}
	if !s.Allow("a", now) || len(s.Blocked(now)) != 0 || s.State("a") != Closed || calls != 0 {
		t.Fatalf("disabled breaker acted: allow=%v blocked=%v state=%s calls=%d", s.Allow("a", now), s.Blocked(now), s.State("a"), calls)
	}
}

func TestBreakerForget(t *testing.T) {
	s := NewSet(Config{Enabled: true, FailureThreshold: 1, SuccessThreshold: 1, Timeout: time.Minute}, nil)
	now := time.Now()
	s.Failure("a", now)
	s.Failure("b", now)
	s.Forget(map[string]bool{"b": true})
	if s.State("a") != Closed || s.State("b") != Open {
		t.Fatalf("after Forget: a=%s (want closed: forgotten) b=%s (want open: kept)", s.State("a"), s.State("b"))
	}
	if got := s.Blocked(now); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("Blocked = %v, want [b]", got)
	}
}

// The callback runs without the set's lock held, so it may call back into
// the set (the server's callback reads nothing, but a deadlock here would
// hang every request).
func TestBreakerCallbackMayReenter(t *testing.T) {
	var s *Set
	var seen []State
	s = NewSet(Config{Enabled: true, FailureThreshold: 1, SuccessThreshold: 1, Timeout: time.Second}, func(tr Transition) {
		seen = append(seen, s.State(tr.Worker))
	})
	t0 := time.Now()
	s.Failure("a", t0)
	s.Blocked(t0.Add(time.Second))
	s.Success("a")
	if !slices.Equal(seen, []State{Open, HalfOpen, Closed}) {
		t.Fatalf("states seen from the callback: %v", seen)
	}
}

func TestStateStrings(t *testing.T) {
	for s, want := range map[State]string{Closed: "closed", Open: "open", HalfOpen: "half_open"} {
		if s.String() != want {
			t.Fatalf("%d.String() = %q, want %q", s, s.String(), want)
		}
	}
}

// A half-open worker gets at most SuccessThreshold trials in flight at a
// time: a still-sick replica is probed, not flooded.
func TestHalfOpenLimitsTrialsInFlight(t *testing.T) {
	s := NewSet(Config{Enabled: true, FailureThreshold: 1, SuccessThreshold: 2, Timeout: time.Second}, nil)
	t0 := time.Unix(0, 0)
	s.Failure("w", t0) // open
	now := t0.Add(time.Second)
	if b := s.Blocked(now); len(b) != 0 {
		t.Fatalf("timeout passed, still blocked: %v", b)
	}
	s.Begin("w")
	if b := s.Blocked(now); len(b) != 0 {
		t.Fatalf("one trial in flight already blocks: %v", b)
	}
	s.Begin("w")
	if b := s.Blocked(now); len(b) != 1 {
		t.Fatalf("two trials in flight (the success threshold) do not block further traffic: %v", b)
	}
	s.Abandon("w") // a client hang-up frees its trial without judging
	if b := s.Blocked(now); len(b) != 0 {
		t.Fatalf("abandoned trial still counted: %v", b)
	}
	s.Success("w")
	s.Begin("w")
	s.Success("w")
	if st := s.State("w"); st != Closed {
		t.Fatalf("two successful trials left it %s", st)
	}
}

// A view of the breakers must not keep showing "open" for a worker that
// would get the next request: once the timeout has passed, or once its
// health check is green again, it is half-open.
func TestStateAtAndHealthRecovery(t *testing.T) {
	var trans []Transition
	s := NewSet(Config{Enabled: true, FailureThreshold: 1, SuccessThreshold: 1, Timeout: 10 * time.Second},
		func(tr Transition) { trans = append(trans, tr) })
	t0 := time.Unix(1000, 0)
	if st := s.StateAt("unknown", t0); st != Closed {
		t.Fatalf("unknown worker: %s", st)
	}
	s.Failure("a", t0)
	s.Failure("b", t0)
	if st := s.StateAt("a", t0.Add(9*time.Second)); st != Open {
		t.Fatalf("before the timeout: %s, want open", st)
	}
	if st := s.StateAt("a", t0.Add(10*time.Second)); st != HalfOpen {
		t.Fatalf("after the timeout with no traffic: %s, want half_open", st)
	}
	s.HealthRecovered("b")
	if st := s.State("b"); st != HalfOpen {
		t.Fatalf("after its health check turned green: %s, want half_open", st)
	}
	s.HealthRecovered("c") // never opened: nothing to do
	if st := s.State("c"); st != Closed {
		t.Fatalf("a closed breaker moved on health recovery: %s", st)
	}
	want := []Transition{{"a", Closed, Open}, {"b", Closed, Open}, {"a", Open, HalfOpen}, {"b", Open, HalfOpen}}
	if !slices.Equal(trans, want) {
		t.Fatalf("transitions %v, want %v", trans, want)
	}
}
