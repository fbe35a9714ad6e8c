package engine

import (
	"fmt"
	"strings"
	"testing"
)

// The capacity model forgets the least recently sent prefixes once a
// worker's modelled cache is full, so an old prefix is no longer a match.
func TestCapacityModelForgetsEvictedPrefixes(t *testing.T) {
	pol := testPolicy()
	pol.CapacityBlocks = 8 // blocks
	e := newTestEngine(t, pol, urls("a")...)
	old := textOf(4*testBC, 1)
	place(t, e, "a", old)
	if got := holds(t, e, "a", old); got != 4 {
		t.Fatalf("holds %d blocks of the first prompt, want 4", got)
	}
	place(t, e, "a", textOf(4*testBC, 2)) // 8 blocks: still fits
	if got := holds(t, e, "a", old); got != 4 {
		t.Fatalf("after filling: holds %d, want 4", got)
	}
	place(t, e, "a", textOf(4*testBC, 3)) // 12 blocks: the oldest 4 go
	if got := holds(t, e, "a", old); got != 0 {
		t.Fatalf("evicted prefix still held: %d blocks", got)
	}
	if a := e.Workers()[0].Accuracy; a.ModelBlocks != 8 || a.ModelCapacity != 8 {
		t.Fatalf("model %+v", a)
	}
}

// A per-worker capacity overrides the pool default.
func TestCapacityPerWorker(t *testing.T) {
	pol := testPolicy()
	pol.CapacityBlocks = 100
	e := newTestEngine(t, pol, WorkerSpec{URL: "small", CapacityBlocks: 2}, WorkerSpec{URL: "big"})
	text := textOf(4*testBC, 9)
	place(t, e, "small", text)
	place(t, e, "big", text)
	if got := holds(t, e, "small", text); got != 2 {
		t.Fatalf("small worker holds %d blocks, want its capacity 2", got)
	}
	if got := holds(t, e, "big", text); got != 4 {
		t.Fatalf("big worker holds %d blocks, want 4", got)
	}
}

func TestTTLIgnoresOldPlacements(t *testing.T) {
	pol := testPolicy()
	pol.TTL = 100
	e := newTestEngine(t, pol, urls("a", "b")...)
	text := textOf(4*testBC, 1)
	r := req(text)
	r.Exclude = []string{"b"}
	if _, err := e.Choose(r, 1000); err != nil {
		t.Fatal(err)
	}
	e.Release("a")
	d, _ := e.Choose(Request{Hashes: r.Hashes, KeyLen: r.KeyLen, DryRun: true}, 1100)
	if d.Reason != ReasonCacheHit {
		t.Fatalf("within TTL: %s", d.Reason)
	}
	d, _ = e.Choose(Request{Hashes: r.Hashes, KeyLen: r.KeyLen, DryRun: true}, 1101)
	if d.Reason != ReasonCacheMiss {
		t.Fatalf("past TTL: %s, want cache_miss", d.Reason)
	}
}

// The closed loop shrinks a worker's modelled capacity when it reports far
// fewer cached tokens than predicted, and lets it grow back slowly.
func TestClosedLoopShrinksAndRegrows(t *testing.T) {
	pol := testPolicy()
	pol.ClosedLoop = true
	e := newTestEngine(t, pol, urls("a")...)
	for i := range 200 {
		place(t, e, "a", textOf(2*testBC, byte(i)))
	}
	before := e.Workers()[0].Accuracy
	if before.ModelCapacity != 0 || before.ModelBlocks == 0 {
		t.Fatalf("unbounded model expected before feedback: %+v", before)
	}
	keyLen := 8 * testBC
	// A young prediction is not judged (the worker may still be
	// computing the prefix).
	e.Feedback("a", keyLen, keyLen, settleNanos-1, 100, 0)
	if got := e.Workers()[0].Accuracy; got.Misses != 0 || got.ModelCapacity != 0 {
		t.Fatalf("judged a young prediction: %+v", got)
	}
	// Predicted all, had nothing: a miss.
	e.Feedback("a", keyLen, keyLen, settleNanos, 100, 0)
	after := e.Workers()[0].Accuracy
	if after.Misses != 1 || after.ModelCapacity == 0 || after.ModelCapacity >= before.ModelBlocks || after.ModelBlocks > after.ModelCapacity {
		t.Fatalf("after a miss: %+v (before %+v)", after, before)
	}
	if after.PredictedTokens != 200 || after.ActualTokens != 0 || after.Reports != 2 {
		t.Fatalf("accuracy counters %+v", after)
	}
	// Confirmed predictions grow the capacity back.
	e.Feedback("a", keyLen, keyLen, settleNanos, 100, 100)
	if grown := e.Workers()[0].Accuracy.ModelCapacity; grown <= after.ModelCapacity {
		t.Fatalf("capacity did not grow after a confirmed prediction: %d -> %d", after.ModelCapacity, grown)
	}
}

func TestClosedLoopOffOnlyCounts(t *testing.T) {
	e := newTestEngine(t, testPolicy(), urls("a")...)
	e.Feedback("a", 100, 100, settleNanos, 10, 0)
	a := e.Workers()[0].Accuracy
	if a.Reports != 1 || a.Misses != 0 || a.ModelCapacity != 0 {
		t.Fatalf("closed loop off: %+v", a)
	}
}

func TestSessionAffinityWithLoadBound(t *testing.T) {
	pol := testPolicy()
	pol.SessionTTL = 1000
	e := newTestEngine(t, pol, urls("a", "b")...)
	first := req(textOf(testBC, 1))
	first.Session = "s1"
	first.Exclude = []string{"b"}
	if _, err := e.Choose(first, 0); err != nil {
		t.Fatal(err)
	}
	e.Release("a")
	// An unrelated prompt with the same session sticks to a.
	next := req(textOf(testBC, 2))
	next.Session = "s1"
	d, _ := e.Choose(next, 10)
	if d.Worker != "a" || d.Reason != ReasonSessionHit {
		t.Fatalf("session request went %s (%s)", d.Worker, d.Reason)
	}
	e.Release("a")
	// Overloaded by the balance rule (3 > 2 and 3 > 0*1.5): load wins.
	setLoad(t, e, "a", 3)
	next.Hashes = req(textOf(testBC, 3)).Hashes
	d, _ = e.Choose(next, 20)
	if d.Worker != "b" || d.Reason == ReasonSessionHit {
		t.Fatalf("overloaded session worker still chosen: %s (%s)", d.Worker, d.Reason)
	}
	// That decision moved the session to b.
	for range 3 {
		e.Release("a")
	}
	e.Release("b")
	d, _ = e.Choose(next, 30)
	if d.Worker != "b" || d.Reason != ReasonSessionHit {
		t.Fatalf("session did not follow its new worker: %s (%s)", d.Worker, d.Reason)
	}
	e.Release("b")
	// Expiry.
	if n, done := e.ExpireSessions(30+1001, 10); n != 1 || !done || e.Sessions() != 0 {
		t.Fatalf("expired %d, %d left", n, e.Sessions())
	}
	d, _ = e.Choose(next, 2000)
	if d.Reason == ReasonSessionHit {
		t.Fatal("expired session still honoured")
	}
}

func TestSessionsOffIgnoreKeys(t *testing.T) {
	e := newTestEngine(t, testPolicy(), urls("a", "b")...)
	r := req(textOf(testBC, 1))
	r.Session = "s"
	d, _ := e.Choose(r, 0)
	if d.Reason == ReasonSessionHit || e.Sessions() != 0 {
		t.Fatalf("sessions disabled but %s / %d sessions", d.Reason, e.Sessions())
	}
}

// A prefix in most requests (a global system prompt) must not pin traffic
// to its holder: with hot-prefix spreading the match is judged on what
// follows it, so requests sharing only the hot prefix go least-loaded and
// the prefix spreads over several workers.
func TestHotPrefixSpreads(t *testing.T) {
	run := func(fraction float64) (holders int, hits int) {
		pol := testPolicy()
		pol.Threshold = 0.3
		pol.HotFraction = fraction
		e := newTestEngine(t, pol, urls("a", "b", "c", "d")...)
		system := textOf(8*testBC, 200)
		for i := range 400 {
			// Each request: the system prompt plus a short unique tail,
			// so the shared part alone is over the 0.3 threshold.
			r := req(system + strings.Repeat(fmt.Sprintf("q%07d ", i), 4))
			d, err := e.Choose(r, int64(i))
			if err != nil {
				t.Fatal(err)
			}
			if d.Reason == ReasonCacheHit {
				hits++
			}
			e.Release(d.Worker)
		}
		var m = req(system)
		e.idx.Lookup(m.Hashes, &e.match)
		return len(e.match.Workers), hits
	}
	plainHolders, plainHits := run(0)
	hotHolders, hotHits := run(0.3)
	if plainHits < 300 {
		t.Fatalf("plain policy: only %d of 400 hit on the shared prefix", plainHits)
	}
	if hotHits > 50 || hotHolders < 3 {
		t.Fatalf("hot-prefix spreading: %d hits, prefix held by %d workers (plain: %d hits, %d holders)", hotHits, hotHolders, plainHits, plainHolders)
	}
}

// A conversation-specific prefix beyond the hot one still decides.
func TestHotPrefixKeepsDeeperAffinity(t *testing.T) {
	pol := testPolicy()
	pol.Threshold = 0.3
	pol.HotFraction = 0.3
	e := newTestEngine(t, pol, urls("a", "b", "c")...)
	system := textOf(4*testBC, 100)
	for i := range 100 {
		d, _ := e.Choose(req(system+strings.Repeat(fmt.Sprintf("q%07d ", i), 4)), int64(i))
		e.Release(d.Worker)
	}
	conv := system + textOf(16*testBC, 250)
	d1, _ := e.Choose(req(conv), 200)
	e.Release(d1.Worker)
	d2, _ := e.Choose(req(conv+"and a follow-up question"), 201)
	e.Release(d2.Worker)
	if d2.Reason != ReasonCacheHit || d2.Worker != d1.Worker || d2.HotChars == 0 {
		t.Fatalf("follow-up: %+v (first went to %s)", d2, d1.Worker)
	}
}
