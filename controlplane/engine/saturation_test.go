package engine

import "testing"

func TestObserveEngineLearnsConcurrency(t *testing.T) {
	e := newTestEngine(t, testPolicy(), WorkerSpec{URL: "a"}, WorkerSpec{URL: "b", MaxConcurrency: 2})
	steps := []struct {
		url        string
		obs        EngineLoad
		times      int
		want       int
		wantChange bool
	}{
		{"a", EngineLoad{Running: 10, Waiting: 0}, 1, 0, false},            // never queued: unknown
		{"a", EngineLoad{Running: 4, Waiting: 3}, 1, 4, true},              // queued: what it runs
		{"a", EngineLoad{Running: 4, Waiting: 0}, GrowAfter - 1, 4, false}, // at the limit, not long enough
		{"a", EngineLoad{Running: 4, Waiting: 0}, 1, 5, true},              // GrowAfter in a row: one more
		{"a", EngineLoad{Running: 2, Waiting: 0}, GrowAfter, 5, false},     // below the limit: no growth
		{"a", EngineLoad{Running: 0, Waiting: 2}, 1, 1, true},              // queued with nothing running: at least 1
		{"b", EngineLoad{Running: 1, Waiting: 5}, 1, 2, false},             // declared wins
	}
	for i, s := range steps {
		changed := false
		for range s.times {
			changed = e.ObserveEngine(s.url, s.obs) || changed
		}
		if got, _ := e.Concurrency(s.url); got != s.want || changed != s.wantChange {
			t.Fatalf("step %d: limit %d (changed %v), want %d (%v)", i, got, changed, s.want, s.wantChange)
		}
	}
}

// A worker at its limit is saturated; the headroom lowers the limit for
// low priorities only while active.
func TestSaturationAndHeadroom(t *testing.T) {
	pol := testPolicy()
	pol.ReservePriority, pol.ReserveSlots = 5, 1
	e := newTestEngine(t, pol, WorkerSpec{URL: "a", MaxConcurrency: 2, MaxLoad: 3})
	r := req("x")
	if _, err := e.Choose(r, 1); err != nil {
		t.Fatal(err)
	}
	e.SetReserveActive(true)
	if _, err := e.Choose(r, 2); err != ErrAllSaturated {
		t.Fatalf("low priority with 1 of 2 taken and 1 reserved: %v", err)
	}
	r.Priority = 5
	if _, err := e.Choose(r, 3); err != nil {
		t.Fatalf("high priority into the reserved slot: %v", err)
	}
	if _, err := e.Choose(r, 4); err != ErrAllSaturated {
		t.Fatalf("at max_concurrency 2: %v", err)
	}
	freed := e.Freed()
	e.Release("a")
	if e.Freed() == freed {
		t.Fatal("a release did not count as freed room")
	}
	if !e.HasRoom(5) || e.HasRoom(0) {
		t.Fatalf("HasRoom(5)=%v HasRoom(0)=%v with 1 of 2 taken and the reserve on", e.HasRoom(5), e.HasRoom(0))
	}
	e.SetReserveActive(false)
	if !e.HasRoom(0) {
		t.Fatal("reserve off, a slot free: no room for priority 0")
	}
}
