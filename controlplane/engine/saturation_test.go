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
			before, after := e.ObserveEngine(s.url, s.obs)
			changed = before != after || changed
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
	if !e.HasRoom(5, false) || e.HasRoom(0, false) {
		t.Fatalf("HasRoom(5)=%v HasRoom(0)=%v with 1 of 2 taken and the reserve on", e.HasRoom(5, false), e.HasRoom(0, false))
	}
	e.SetReserveActive(false)
	if !e.HasRoom(0, false) {
		t.Fatal("reserve off, a slot free: no room for priority 0")
	}
}

// An engine with a fixed batch limit fails every probe past it: each
// failure doubles the wait before the next, so a saturated engine's
// queue holds a probed request rarely instead of once every GrowAfter
// reads. When its room really grows, the limit still follows, at most
// MaxGrowAfter reads later, and a probe that finds room starts the wait
// afresh.
func TestFailedProbesBackOff(t *testing.T) {
	e := newTestEngine(t, testPolicy(), WorkerSpec{URL: "a"})
	capacity := 4
	// read is one scrape of an engine CART keeps at its limit: it runs
	// what it can of that and queues the rest.
	read := func() (before, after int) {
		l, _ := e.Concurrency("a")
		if l == 0 {
			l = capacity + 3 // before the first queueing: no limit, more sent
		}
		return e.ObserveEngine("a", EngineLoad{Running: min(l, capacity), Waiting: max(l-capacity, 0)})
	}
	if _, l := read(); l != capacity {
		t.Fatalf("first queueing read: limit %d, want %d", l, capacity)
	}
	const reads = 10_000
	probes, overLimit := 0, 0
	for range reads {
		if before, after := read(); after != before && after > capacity {
			probes++
		}
		if l, _ := e.Concurrency("a"); l > capacity {
			overLimit++
		}
	}
	// Without the back-off: one probe every GrowAfter+1 reads (322 here).
	// With it: the probes of the doubling waits (30, 60, ..., 960), then
	// one every MaxGrowAfter+1 reads.
	want, left := 0, reads
	for wait := GrowAfter; left > wait; wait = min(2*wait, MaxGrowAfter) {
		left -= wait + 1
		want++
	}
	if probes != want || overLimit != probes || probes > reads/500 {
		t.Fatalf("%d probes over %d reads at a fixed limit (%d reads over it), want %d (one read each, and at most one per 500 reads)", probes, reads, overLimit, want)
	}

	// The engine gets room for 6: the limit reaches it within one
	// backed-off wait and one fresh one.
	capacity = 6
	n := 0
	for ; n < MaxGrowAfter+GrowAfter+2; n++ {
		if _, l := read(); l == capacity {
			break
		}
	}
	if l, _ := e.Concurrency("a"); l != capacity {
		t.Fatalf("after %d reads with room for %d: limit %d", n, capacity, l)
	}
	if n <= GrowAfter {
		t.Fatalf("the limit followed after %d reads: the back-off did not hold", n)
	}
}

// A probe's slot (the top of a limit just raised) is open only to
// requests that allow it, until the engine confirms it; no probe is made
// while the headroom is held.
func TestProbeSlot(t *testing.T) {
	pol := testPolicy()
	pol.ReservePriority, pol.ReserveSlots = 5, 1
	e := newTestEngine(t, pol, WorkerSpec{URL: "a"})
	e.ObserveEngine("a", EngineLoad{Running: 2, Waiting: 1}) // learned 2
	for range GrowAfter {
		e.ObserveEngine("a", EngineLoad{Running: 2, Waiting: 0})
	}
	if l, _ := e.Concurrency("a"); l != 3 {
		t.Fatalf("limit %d after GrowAfter reads at 2, want 3 (a probe)", l)
	}
	r := req("x")
	r.NoProbe = true
	for i := range 2 {
		if _, err := e.Choose(r, int64(i+1)); err != nil {
			t.Fatalf("confirmed slot %d: %v", i+1, err)
		}
	}
	if e.ProbeRoom() != true || e.HasRoom(0, true) || !e.HasRoom(0, false) {
		t.Fatalf("2 of 3 taken, the third a probe's: ProbeRoom %v, HasRoom without it %v, with it %v", e.ProbeRoom(), e.HasRoom(0, true), e.HasRoom(0, false))
	}
	if _, err := e.Choose(r, 3); err != ErrAllSaturated {
		t.Fatalf("NoProbe into the probe's slot: %v, want ErrAllSaturated", err)
	}
	e.SetReserveActive(true)
	if e.ProbeRoom() {
		t.Fatal("ProbeRoom with the headroom held")
	}
	e.SetReserveActive(false)
	r.NoProbe = false
	if _, err := e.Choose(r, 4); err != nil {
		t.Fatalf("into the probe's slot: %v", err)
	}
	if e.ProbeRoom() {
		t.Fatal("the probe's slot taken: still ProbeRoom")
	}
	// The engine runs 3 with nothing waiting: confirmed, an ordinary slot.
	e.Release("a")
	e.ObserveEngine("a", EngineLoad{Running: 3, Waiting: 0})
	r.NoProbe = true
	if _, err := e.Choose(r, 5); err != nil {
		t.Fatalf("the confirmed third slot: %v", err)
	}

	// With the headroom on, reads at the limit never raise it.
	e.Release("a")
	e.SetReserveActive(true)
	for range 4 * MaxGrowAfter {
		e.ObserveEngine("a", EngineLoad{Running: 3, Waiting: 0})
	}
	if l, _ := e.Concurrency("a"); l != 3 {
		t.Fatalf("limit %d after reads at 3 with the headroom on, want 3 (no probe)", l)
	}
	e.SetReserveActive(false)
	for range GrowAfter {
		e.ObserveEngine("a", EngineLoad{Running: 3, Waiting: 0})
	}
	if l, _ := e.Concurrency("a"); l != 4 {
		t.Fatalf("limit %d after GrowAfter reads at 3 with the headroom off, want 4", l)
	}
}
