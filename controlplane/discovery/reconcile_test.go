package discovery

import (
	"errors"
	"reflect"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

func rules() Options {
	return Options{AddAfter: 2, RemoveAfter: 3, DrainTimeout: 10 * time.Second, MinInterval: time.Second, MaxInterval: 30 * time.Second}
}

func ok(ttl time.Duration, eps ...string) Answer { return Answer{Endpoints: eps, TTL: ttl} }

// step is one answer (or one removal check when check is set) at an offset.
type step struct {
	at    time.Duration
	ans   Answer
	check bool
	load  map[string]int
	want  Changes  // for answers (Next checked only when nonzero)
	due   []string // for checks
}

func TestReconciler(t *testing.T) {
	errDNS := errors.New("SERVFAIL")
	tests := []struct {
		name   string
		known  []string
		steps  []step
		active []string
		drain  []string
	}{
		{name: "added after add_after consecutive sightings",
			steps: []step{
				{ans: ok(5*time.Second, "a", "b"), want: Changes{Next: 5 * time.Second}},
				{at: 5 * time.Second, ans: ok(5*time.Second, "b", "a"), want: Changes{Add: []string{"a", "b"}, Next: 5 * time.Second}},
			},
			active: []string{"a", "b"}},
		{name: "a flapping new endpoint is never added (sightings must be consecutive)",
			steps: []step{
				{ans: ok(0, "a", "x"), want: Changes{}},
				{at: 1, ans: ok(0, "a"), want: Changes{Add: []string{"a"}}},
				{at: 2, ans: ok(0, "a", "x"), want: Changes{}},
				{at: 3, ans: ok(0, "a"), want: Changes{}},
			},
			active: []string{"a"}},
		{name: "removed only after remove_after consecutive absences",
			known: []string{"a", "b"},
			steps: []step{
				{ans: ok(0, "a"), want: Changes{}},
				{at: 1, ans: ok(0, "a"), want: Changes{}},
				{at: 2, ans: ok(0, "a"), want: Changes{Drain: []string{"b"}}},
			},
			active: []string{"a"}, drain: []string{"b"}},
		{name: "a flapping member is damped: absences reset when it reappears",
			known: []string{"a", "b"},
			steps: []step{
				{ans: ok(0, "a"), want: Changes{}},
				{at: 1, ans: ok(0, "a"), want: Changes{}},
				{at: 2, ans: ok(0, "a", "b"), want: Changes{}},
				{at: 3, ans: ok(0, "a"), want: Changes{}},
				{at: 4, ans: ok(0, "a"), want: Changes{}},
			},
			active: []string{"a", "b"}},
		{name: "drain then remove once idle",
			known: []string{"a", "b"},
			steps: []step{
				{ans: ok(0, "a")}, {at: 1, ans: ok(0, "a")},
				{at: 2, ans: ok(0, "a"), want: Changes{Drain: []string{"b"}}},
				{at: 3, check: true, load: map[string]int{"b": 2}, due: nil},
				{at: 4, check: true, load: map[string]int{"b": 0}, due: []string{"b"}},
			},
			active: []string{"a"}},
		{name: "drain then remove after the drain timeout even with load",
			known: []string{"a", "b"},
			steps: []step{
				{ans: ok(0, "a")}, {at: 1, ans: ok(0, "a")},
				{at: 2, ans: ok(0, "a"), want: Changes{Drain: []string{"b"}}},
				{at: 2 + 9*time.Second, check: true, load: map[string]int{"b": 1}, due: nil},
				{at: 2 + 10*time.Second, check: true, load: map[string]int{"b": 1}, due: []string{"b"}},
			},
			active: []string{"a"}},
		{name: "a draining member that comes back is undrained",
			known: []string{"a", "b"},
			steps: []step{
				{ans: ok(0, "a")}, {at: 1, ans: ok(0, "a")},
				{at: 2, ans: ok(0, "a"), want: Changes{Drain: []string{"b"}}},
				{at: 3, ans: ok(0, "a", "b"), want: Changes{Undrain: []string{"b"}}},
				{at: 4, check: true, load: map[string]int{"b": 0}, due: nil},
			},
			active: []string{"a", "b"}},
		{name: "resolver error keeps the last set and retries at the minimum interval",
			known: []string{"a", "b"},
			steps: []step{
				{ans: Answer{Err: errDNS}, want: Changes{Stale: true, Next: time.Second}},
				{at: 1, ans: Answer{Err: errDNS}, want: Changes{Stale: true, Next: time.Second}},
				{at: 2, ans: Answer{Err: errDNS}, want: Changes{Stale: true, Next: time.Second}},
				{at: 3, ans: Answer{Err: errDNS}, want: Changes{Stale: true, Next: time.Second}},
			},
			active: []string{"a", "b"}},
		{name: "empty answer keeps the last set and does not count as an absence",
			known: []string{"a", "b"},
			steps: []step{
				{ans: ok(0, "a")}, {at: 1, ans: ok(0, "a")},
				{at: 2, ans: ok(0), want: Changes{Stale: true, Next: time.Second}},
				{at: 3, ans: ok(0), want: Changes{Stale: true, Next: time.Second}},
			},
			active: []string{"a", "b"}},
		{name: "interval follows the TTL within bounds",
			known: []string{"a"},
			steps: []step{
				{ans: ok(7*time.Second, "a"), want: Changes{Next: 7 * time.Second}},
				{at: 1, ans: ok(0, "a"), want: Changes{Next: time.Second}},
				{at: 2, ans: ok(300*time.Millisecond, "a"), want: Changes{Next: time.Second}},
				{at: 3, ans: ok(time.Hour, "a"), want: Changes{Next: 30 * time.Second}},
			},
			active: []string{"a"}},
		{name: "duplicate endpoints in one answer count once",
			steps: []step{
				{ans: ok(0, "a", "a"), want: Changes{}},
				{at: 1, ans: ok(0, "a", "a"), want: Changes{Add: []string{"a"}}},
			},
			active: []string{"a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewReconciler(rules(), tt.known)
			for i, s := range tt.steps {
				now := t0.Add(s.at)
				if s.check {
					due := r.Due(now, func(u string) int { return s.load[u] })
					if !reflect.DeepEqual(due, s.due) {
						t.Fatalf("step %d: due = %v, want %v", i, due, s.due)
					}
					for _, u := range due {
						r.Removed(u)
					}
					continue
				}
				got := r.Observe(s.ans, now)
				if s.want.Next == 0 {
					got.Next = 0
				}
				if !reflect.DeepEqual(got, s.want) {
					t.Fatalf("step %d: changes = %+v, want %+v", i, got, s.want)
				}
				if r.Stale() != s.want.Stale {
					t.Fatalf("step %d: Stale() = %v", i, r.Stale())
				}
			}
			if got := r.Active(); !reflect.DeepEqual(got, tt.active) {
				t.Errorf("active = %v, want %v", got, tt.active)
			}
			if got := r.Draining(); !reflect.DeepEqual(got, tt.drain) {
				t.Errorf("draining = %v, want %v", got, tt.drain)
			}
		})
	}
}
