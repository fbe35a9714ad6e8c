package engine

import (
	"crypto/sha256"

	"github.com/cartrouter/cart/controlplane/index"
)

// ---- sessions -------------------------------------------------------------
//
// Session keys come from clients (a header, prompt_cache_key, user) and may
// be of any size, so the table keeps a 128-bit hash of each instead of the
// key: a table entry costs the same for a 5 MB key as for a UUID. SHA-256
// rather than a fast hash because clients choose the keys: finding two that
// collide, and so steering someone else's session, must stay impractical.
//
// The table is bounded (Policy.MaxSessions) by least-recent use, and its
// entries live on an intrusive LRU list, so expiry walks from the
// least recently used end and stops at the first live session: the work per
// maintenance step is bounded, with no scan of the whole table under the
// routing lock.

type sessionHash [16]byte

func hashSession(key string) sessionHash {
	sum := sha256.Sum256([]byte(key))
	var h sessionHash
	copy(h[:], sum[:])
	return h
}

const noSession = -1

type sessionEntry struct {
	key        sessionHash
	w          index.WorkerID
	last       int64
	prev, next int32 // LRU neighbours; prev is more recent
}

type sessionTable struct {
	byKey      map[sessionHash]int32
	slab       []sessionEntry
	free       []int32
	head, tail int32 // most and least recently used
}

func (t *sessionTable) init() {
	if t.byKey == nil {
		t.byKey = make(map[sessionHash]int32)
		t.head, t.tail = noSession, noSession
	}
}

func (t *sessionTable) unlink(i int32) {
	e := &t.slab[i]
	if e.prev != noSession {
		t.slab[e.prev].next = e.next
	} else {
		t.head = e.next
	}
	if e.next != noSession {
		t.slab[e.next].prev = e.prev
	} else {
		t.tail = e.prev
	}
	e.prev, e.next = noSession, noSession
}

func (t *sessionTable) pushFront(i int32) {
	e := &t.slab[i]
	e.prev, e.next = noSession, t.head
	if t.head != noSession {
		t.slab[t.head].prev = i
	}
	t.head = i
	if t.tail == noSession {
		t.tail = i
	}
}

func (t *sessionTable) remove(i int32) {
	t.unlink(i)
	delete(t.byKey, t.slab[i].key)
	t.free = append(t.free, i)
}

// set records key's worker as of now, making it the most recent session
// and forgetting the least recent one when the table is full (max <= 0:
// unbounded).
func (t *sessionTable) set(key sessionHash, w index.WorkerID, now int64, max int) {
	t.init()
	if i, ok := t.byKey[key]; ok {
		t.slab[i].w, t.slab[i].last = w, now
		t.unlink(i)
		t.pushFront(i)
		return
	}
	if max > 0 && len(t.byKey) >= max {
		t.remove(t.tail)
	}
	i := takeSlot(&t.slab, &t.free)
	t.slab[i] = sessionEntry{key: key, w: w, last: now}
	t.byKey[key] = i
	t.pushFront(i)
}

func (t *sessionTable) get(key sessionHash) (sessionEntry, bool) {
	i, ok := t.byKey[key]
	if !ok {
		return sessionEntry{}, false
	}
	return t.slab[i], true
}

// sessionWorker returns the usable worker of a live session, or nil.
func (e *Engine) sessionWorker(key string, now int64) *worker {
	if key == "" || e.pol.SessionTTL <= 0 {
		return nil
	}
	s, ok := e.sessions.get(hashSession(key))
	if !ok || now-s.last > e.pol.SessionTTL {
		return nil
	}
	w, ok := e.byID[s.w]
	if !ok || !e.isUsable(w) {
		return nil
	}
	return w
}

func (e *Engine) setSession(key string, w index.WorkerID, now int64) {
	e.sessions.set(hashSession(key), w, now, e.pol.MaxSessions)
}

// ExpireSessions forgets up to max sessions idle longer than the session
// TTL, least recently used first, and reports how many it dropped and
// whether none is left to expire.
func (e *Engine) ExpireSessions(now int64, max int) (n int, done bool) {
	t := &e.sessions
	if len(t.byKey) == 0 {
		// Also the zero table, which set has not initialised yet: its
		// head and tail are 0, not noSession, so they must not be read.
		t.slab, t.free, t.byKey = nil, nil, nil
		return 0, true
	}
	for t.tail != noSession && now-t.slab[t.tail].last > e.pol.SessionTTL {
		if n >= max {
			return n, false
		}
		t.remove(t.tail)
		n++
	}
	if len(t.byKey) == 0 {
		// Everything expired: give the slab back rather than keep a
		// past burst's worth of memory for good.
		t.slab, t.free, t.byKey = nil, nil, nil
	}
	return n, true
}

// Sessions is the number of sessions remembered, live or not yet expired.
func (e *Engine) Sessions() int { return len(e.sessions.byKey) }

// takeSlot returns the index of an unused element of *slab: the last freed
// one in *free if any, else a new one appended.
func takeSlot[T any](slab *[]T, free *[]int32) int32 {
	if k := len(*free); k > 0 {
		i := (*free)[k-1]
		*free = (*free)[:k-1]
		return i
	}
	var zero T
	*slab = append(*slab, zero)
	return int32(len(*slab) - 1)
}
