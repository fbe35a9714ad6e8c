package engine

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/cartrouter/cart/controlplane/index"
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
	d, err := e.Choose(r, now)
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

// An engine that never set a session must survive maintenance: the first
// pass of an idle router with sessions on used to read the zero table's
// tail (0, not noSession) and panic.
func TestExpireSessionsOnEmptyTable(t *testing.T) {
	e := sessionEngine(t, 100, 10)
	for now := int64(0); now < 3; now++ {
		if n, done := e.ExpireSessions(now*1000, 8); n != 0 || !done {
			t.Fatalf("empty table: expired %d, done %v", n, done)
		}
		if !e.MaintainStep(now*1000, 1<<20, 8) {
			t.Fatal("MaintainStep on an empty engine not done")
		}
	}
	// Emptied by expiry, then used and emptied again.
	routeSession(t, e, "s", "a", 5000)
	if n, done := e.ExpireSessions(9000, 8); n != 1 || !done || e.Sessions() != 0 {
		t.Fatalf("expired %d (done %v), %d left", n, done, e.Sessions())
	}
	if n, done := e.ExpireSessions(9001, 8); n != 0 || !done {
		t.Fatalf("table emptied by expiry: expired %d, done %v", n, done)
	}
	if d := routeSession(t, e, "s", "b", 9002); d.Worker != "b" {
		t.Fatalf("session after emptying went to %s", d.Worker)
	}
}

// sessionModel is the table's behaviour written the slow, obvious way:
// keys in most-recent-first order with their worker and last use.
type sessionModel struct {
	keys []sessionHash
	w    map[sessionHash]index.WorkerID
	last map[sessionHash]int64
}

func (m *sessionModel) touch(k sessionHash) {
	m.keys = slices.DeleteFunc(m.keys, func(x sessionHash) bool { return x == k })
	m.keys = slices.Insert(m.keys, 0, k)
}

// The session table against its model, under any order of set, get and
// expiry (on an empty table, a full one, one emptied by expiry), with
// bounds and chunk sizes chosen by the fuzzer. Seeds run in every test.
func FuzzSessionTable(f *testing.F) {
	f.Add([]byte{})                                   // expiry first, on the zero table
	f.Add([]byte{0x00, 0x10, 0x21, 0x80, 0xff, 0x03}) // set, set, expire all, set
	f.Add([]byte("the session table takes any order of operations"))
	f.Fuzz(func(t *testing.T, ops []byte) {
		const ttl = 10
		max := 0
		if len(ops) > 0 {
			max = int(ops[0] % 5) // 0: unbounded
		}
		e := &Engine{pol: Policy{SessionTTL: ttl, MaxSessions: max}}
		m := &sessionModel{w: map[sessionHash]index.WorkerID{}, last: map[sessionHash]int64{}}
		now := int64(0)
		check := func(step int) {
			t.Helper()
			if e.Sessions() != len(m.keys) {
				t.Fatalf("step %d: %d sessions, model has %d", step, e.Sessions(), len(m.keys))
			}
			for _, k := range m.keys {
				s, ok := e.sessions.get(k)
				if !ok || s.w != m.w[k] || s.last != m.last[k] {
					t.Fatalf("step %d: session %x is %+v (found %v), model %d@%d", step, k[:2], s, ok, m.w[k], m.last[k])
				}
			}
			// The LRU list, walked both ways, is the model's order.
			var fwd []sessionHash
			for i := e.sessions.head; i != noSession && len(m.keys) > 0; i = e.sessions.slab[i].next {
				fwd = append(fwd, e.sessions.slab[i].key)
				if len(fwd) > len(m.keys) {
					t.Fatalf("step %d: LRU list longer than the table", step)
				}
			}
			if len(m.keys) > 0 && !slices.Equal(fwd, m.keys) {
				t.Fatalf("step %d: LRU order differs from the model", step)
			}
		}
		for i, op := range ops {
			key := sessionHash{op & 0x0f}
			switch op >> 6 {
			case 0, 1: // set
				w := index.WorkerID(op>>4&3 + 1)
				e.sessions.set(key, w, now, max)
				if _, ok := m.w[key]; !ok && max > 0 && len(m.keys) >= max {
					old := m.keys[len(m.keys)-1]
					m.keys = m.keys[:len(m.keys)-1]
					delete(m.w, old)
					delete(m.last, old)
				}
				m.w[key], m.last[key] = w, now
				m.touch(key)
			case 2: // time passes
				now += int64(op & 0x3f)
			case 3: // expiry in chunks of 1-8
				chunk := int(op&7) + 1
				n, done := e.ExpireSessions(now, chunk)
				want := 0
				for len(m.keys) > 0 && want < chunk {
					old := m.keys[len(m.keys)-1]
					if now-m.last[old] <= ttl {
						break
					}
					m.keys = m.keys[:len(m.keys)-1]
					delete(m.w, old)
					delete(m.last, old)
					want++
				}
				if n != want {
					t.Fatalf("step %d: expired %d, model %d", i, n, want)
				}
				more := len(m.keys) > 0 && now-m.last[m.keys[len(m.keys)-1]] > ttl
				if done == more {
					t.Fatalf("step %d: done %v with expired sessions left %v", i, done, more)
				}
			}
			check(i)
		}
	})
}
