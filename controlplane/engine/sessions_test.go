package engine

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

func sessionEngine(t *testing.T, ttl int64, max int) *Engine {
	t.Helper()
	pol := testPolicy()
	pol.SessionTTL, pol.MaxSessions = ttl, max
	return newTestEngine(t, pol, urls("a", "b")...)
}

// route sends a request with session key s pinned to worker w (the other
// excluded) at now, and settles its load.
func routeSession(t *testing.T, e *Engine, s, w string, now int64) Decision {
	t.Helper()
	r := req(textOf(testBC, byte(now)))
	r.Session = s
	if w != "" {
		r.Exclude = []string{map[string]string{"a": "b", "b": "a"}[w]}
	}
	d, err := e.Route(r, now)
	if err != nil {
		t.Fatal(err)
	}
	e.Release(d.Worker)
	return d
}

// The table keeps a fixed-size hash, not the client's key: 20 sessions
// with 1 MiB keys must not keep 20 MiB alive for the TTL.
func TestSessionKeysAreNotRetained(t *testing.T) {
	e := sessionEngine(t, 1e12, 1000)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range 20 {
		routeSession(t, e, strings.Repeat(fmt.Sprint(i%10), 1<<20)+fmt.Sprint(i), "", int64(i))
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if e.Sessions() != 20 {
		t.Fatalf("%d sessions, want 20", e.Sessions())
	}
	if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > 4<<20 {
		t.Fatalf("heap grew by %d bytes for 20 sessions: keys are retained", grown)
	}
	// Identity survives hashing: the same long key finds its worker.
	long := strings.Repeat("0", 1<<20) + "0"
	w := routeSession(t, e, long, "", 100).Worker
	if d := routeSession(t, e, long, "", 101); d.Worker != w || d.Reason != ReasonSessionHit {
		t.Fatalf("long key: %s (%s), want a session hit on %s", d.Worker, d.Reason, w)
	}
}

// A full table forgets its least recently used session first.
func TestSessionTableEvictsLeastRecentlyUsed(t *testing.T) {
	e := sessionEngine(t, 1e12, 3)
	routeSession(t, e, "s1", "a", 1)
	routeSession(t, e, "s2", "b", 2)
	routeSession(t, e, "s3", "a", 3)
	routeSession(t, e, "s1", "", 4) // s1 used again: s2 is now the oldest
	routeSession(t, e, "s4", "b", 5)
	if e.Sessions() != 3 {
		t.Fatalf("%d sessions with a cap of 3", e.Sessions())
	}
	for _, s := range []string{"s1", "s3", "s4"} {
		if d := routeSession(t, e, s, "", 10); d.Reason != ReasonSessionHit {
			t.Fatalf("%s forgotten (%s), but s2 was the least recently used", s, d.Reason)
		}
	}
	if e.sessionWorker("s2", 10) != nil {
		t.Fatal("s2 kept although it was the least recently used")
	}
}

// Expiry works from the least recently used end, at most max entries per
// call, and stops at the first live session without looking further.
func TestExpireSessionsIsIncremental(t *testing.T) {
	e := sessionEngine(t, 100, 0)
	for i := range 10 {
		routeSession(t, e, fmt.Sprint("old", i), "", int64(i))
	}
	routeSession(t, e, "live", "", 500)
	n, done := e.ExpireSessions(550, 4)
	if n != 4 || done {
		t.Fatalf("first step expired %d (done %v), want 4 and more to do", n, done)
	}
	n, done = e.ExpireSessions(550, 4)
	if n != 4 || done {
		t.Fatalf("second step expired %d (done %v), want 4 and more to do", n, done)
	}
	n, done = e.ExpireSessions(550, 4)
	if n != 2 || !done || e.Sessions() != 1 {
		t.Fatalf("third step expired %d (done %v, %d left), want 2, done, the live one left", n, done, e.Sessions())
	}
	if d := routeSession(t, e, "live", "", 551); d.Reason != ReasonSessionHit {
		t.Fatalf("live session lost: %s", d.Reason)
	}
	// MaintainStep expires sessions in the same bounded steps.
	for i := range 10 {
		routeSession(t, e, fmt.Sprint("old", i), "", int64(1000+i))
	}
	steps := 0
	for !e.MaintainStep(5000, 1<<20, 3) {
		steps++
	}
	if steps < 3 || e.Sessions() != 0 {
		t.Fatalf("MaintainStep took %d incomplete steps for 11 sessions in chunks of 3; %d left", steps, e.Sessions())
	}
}
