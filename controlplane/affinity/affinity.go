package affinity

import (
	"container/list"
	"hash/fnv"
	"sync"
	"time"
)

// Defaults for a zero TTL or size.
const (
	DefaultTTL        = time.Hour
	DefaultMaxEntries = 100000
)

// Table maps keys to workers, bounded (the least recently used entry goes
// first) and expiring ttl after an entry was last learned or looked up. It
// is safe for concurrent use.
type Table[K comparable] struct {
	ttl time.Duration
	max int

	mu  sync.Mutex
	lru list.List // of *entry[K], most recently used at the front
	m   map[K]*list.Element
}

type entry[K comparable] struct {
	key     K
	origin  Origin
	expires time.Time
}

// Origin is where a stored response lives and whom it belongs to.
type Origin struct {
	Worker string
	// Tenant is HashTenant of the client key's name that produced the
	// response; 0 when unknown (learned from a node that predates tenants).
	Tenant uint64
}

// Foreign reports whether a request from tenant (HashTenant; 0 when the
// asker does not say) must be refused the response: both are known and
// differ. An origin or a request from a node that predates tenants is not
// refused, so that a rolling upgrade keeps conversations going.
func (o Origin) Foreign(tenant uint64) bool {
	return o.Tenant != 0 && tenant != 0 && o.Tenant != tenant
}

// New builds a table; ttl <= 0 and max <= 0 pick the defaults.
func New[K comparable](ttl time.Duration, max int) *Table[K] {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	if max <= 0 {
		max = DefaultMaxEntries
	}
	return &Table[K]{ttl: ttl, max: max, m: map[K]*list.Element{}}
}

// Learn records that o.Worker produced k for o.Tenant.
func (t *Table[K]) Learn(k K, o Origin, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if el, ok := t.m[k]; ok {
		e := el.Value.(*entry[K])
		e.origin, e.expires = o, now.Add(t.ttl)
		t.lru.MoveToFront(el)
		return
	}
	t.m[k] = t.lru.PushFront(&entry[K]{key: k, origin: o, expires: now.Add(t.ttl)})
	for t.lru.Len() > t.max {
		t.remove(t.lru.Back())
	}
	// Expired entries at the cold end go too, so an idle table shrinks.
	for el := t.lru.Back(); el != nil && !now.Before(el.Value.(*entry[K]).expires); el = t.lru.Back() {
		t.remove(el)
	}
}

// Lookup returns the origin of k. Asked by its own tenant (or by one that
// does not say), it refreshes the entry: a conversation in use stays
// remembered. Another tenant's lookups leave it as it was, so that they can
// neither keep it alive nor push others out of the table.
func (t *Table[K]) Lookup(k K, tenant uint64, now time.Time) (Origin, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	el, ok := t.m[k]
	if !ok {
		return Origin{}, false
	}
	e := el.Value.(*entry[K])
	if !now.Before(e.expires) {
		t.remove(el)
		return Origin{}, false
	}
	if !e.origin.Foreign(tenant) {
		e.expires = now.Add(t.ttl)
		t.lru.MoveToFront(el)
	}
	return e.origin, true
}

// Entry is one remembered key, as Entries lists it and Merge takes it.
type Entry[K comparable] struct {
	Key K
	Origin
	Expires time.Time
}

// Entries lists the entries not expired at now, most recently used first.
func (t *Table[K]) Entries(now time.Time) []Entry[K] {
	// Allocated before taking the lock: zeroing megabytes (and the
	// garbage collector's assist for them) is no part of the hold.
	out := make([]Entry[K], 0, t.Len()+64)
	t.mu.Lock()
	defer t.mu.Unlock()
	for el := t.lru.Front(); el != nil; el = el.Next() {
		if e := el.Value.(*entry[K]); now.Before(e.expires) {
			out = append(out, Entry[K]{Key: e.key, Origin: e.origin, Expires: e.expires})
		}
	}
	return out
}

// Merge adds es (most recently used first, as Entries lists them) to the
// table with their own expiry, behind what it holds: a restored snapshot
// is older than what the node learned since. A key it holds already keeps
// its place and the later of the two expiries. Entries expired at now are
// left out, and the bound holds (the least recently used go first, so a
// full table keeps its own entries).
func (t *Table[K]) Merge(es []Entry[K], now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	// Expired entries must not take the room of live ones: drop them from
	// the least recently used end, where they are.
	for el := t.lru.Back(); el != nil && !now.Before(el.Value.(*entry[K]).expires); el = t.lru.Back() {
		t.remove(el)
	}
	for _, e := range es {
		if !now.Before(e.Expires) {
			continue
		}
		if el, ok := t.m[e.Key]; ok {
			if old := el.Value.(*entry[K]); e.Expires.After(old.expires) {
				old.origin, old.expires = e.Origin, e.Expires
			}
			continue
		}
		if t.lru.Len() >= t.max {
			continue // full: only keys it holds may still move their expiry
		}
		t.m[e.Key] = t.lru.PushBack(&entry[K]{key: e.Key, origin: e.Origin, expires: e.Expires})
	}
}

// Len is the number of entries, expired ones not yet dropped included.
func (t *Table[K]) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lru.Len()
}

func (t *Table[K]) remove(el *list.Element) {
	delete(t.m, el.Value.(*entry[K]).key)
	t.lru.Remove(el)
}

// HashID is the 64-bit hash of a response id that data planes send the
// control plane (FNV-1a): ids are random, so collisions are as unlikely as
// between any two 64-bit values, and a table of hashes has a fixed entry
// size whatever ids a client makes up.
func HashID(id string) uint64 {
	return nonZero(id)
}

// HashTenant is the 64-bit hash of a tenant (a client key's name) that
// travels with a response's origin and with a request for one. Only
// equality matters: names are few and chosen by the operator, so a
// collision between two of them is as unlikely as between two random
// 64-bit values, and no client picks a name.
func HashTenant(name string) uint64 {
	return nonZero("tenant\x00" + name)
}

// nonZero is FNV-1a 64 of s, never 0: 0 means "none" on the wire.
func nonZero(s string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	if v := h.Sum64(); v != 0 {
		return v
	}
	return 1
}
