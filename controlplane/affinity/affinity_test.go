package affinity

import (
	"fmt"
	"testing"
	"time"
)

func TestTableBounded(t *testing.T) {
	a := New[string](time.Hour, 3)
	now := time.Unix(1000, 0)
	for i := range 5 {
		a.Learn(fmt.Sprint("resp_", i), Origin{Worker: "w"}, now)
	}
	if a.Len() != 3 {
		t.Fatalf("len %d, want 3", a.Len())
	}
	if _, ok := a.Lookup("resp_0", 0, now); ok {
		t.Fatal("oldest id kept past max_entries")
	}
	// A lookup makes an id recent: it survives the next insertions.
	if _, ok := a.Lookup("resp_2", 0, now); !ok {
		t.Fatal("resp_2 lost")
	}
	a.Learn("resp_5", Origin{Worker: "w"}, now)
	a.Learn("resp_6", Origin{Worker: "w"}, now)
	if _, ok := a.Lookup("resp_2", 0, now); !ok {
		t.Fatal("recently used id evicted before older ones")
	}
	// Expired entries go when the table is next written.
	later := now.Add(2 * time.Hour)
	a.Learn("resp_7", Origin{Worker: "w"}, later)
	if a.Len() != 1 {
		t.Fatalf("len %d after expiry, want 1", a.Len())
	}
}

func TestHashID(t *testing.T) {
	// The value is part of the wire protocol between data planes and the
	// leader: it must not change between builds.
	if a := HashID("resp_a"); a != 0x81d3677cc91ad487 || a == HashID("resp_b") || HashID("") == 0 {
		t.Fatal("HashID is not a stable non-zero hash")
	}
}

// Entries and Merge carry a table across a snapshot: same entries, same
// recency order, same expiry; expired entries stay out, the bound holds,
// and what the table knew already stays.
func TestEntriesAndMerge(t *testing.T) {
	now := time.Unix(1000, 0)
	src := New[uint64](time.Minute, 10)
	src.Learn(1, Origin{Worker: "a"}, now)
	src.Learn(2, Origin{Worker: "b"}, now.Add(time.Second))
	src.Learn(3, Origin{Worker: "c"}, now.Add(2*time.Second))
	src.Lookup(1, 0, now.Add(3*time.Second)) // 1 is the most recently used now
	es := src.Entries(now.Add(3 * time.Second))
	want := []Entry[uint64]{
		{1, Origin{Worker: "a"}, now.Add(3*time.Second + time.Minute)},
		{3, Origin{Worker: "c"}, now.Add(2*time.Second + time.Minute)},
		{2, Origin{Worker: "b"}, now.Add(time.Second + time.Minute)},
	}
	if fmt.Sprint(es) != fmt.Sprint(want) {
		t.Fatalf("entries %v, want %v", es, want)
	}
	if got := src.Entries(now.Add(time.Minute + 1500*time.Millisecond)); len(got) != 2 {
		t.Fatalf("expired entry listed: %v", got)
	}

	dst := New[uint64](time.Minute, 10)
	dst.Learn(9, Origin{Worker: "known"}, now)
	dst.Learn(1, Origin{Worker: "stale"}, now.Add(-30*time.Second)) // expires before the merged one
	later := now.Add(59 * time.Second)                              // 9 still live; 2 not yet expired
	dst.Merge(es, later)
	for k, w := range map[uint64]string{1: "a", 2: "b", 3: "c", 9: "known"} {
		if got, ok := dst.Lookup(k, 0, later); !ok || got.Worker != w {
			t.Errorf("key %d: %q %v, want %q", k, got.Worker, ok, w)
		}
	}
	// Expiry is kept, not renewed: a merged entry goes when its own time
	// comes, and one already expired is not merged.
	exp := New[uint64](time.Minute, 10)
	exp.Merge([]Entry[uint64]{{3, Origin{Worker: "c"}, now.Add(time.Minute)}, {4, Origin{Worker: "d"}, now}}, now)
	if exp.Len() != 1 {
		t.Fatalf("an expired entry was merged: len %d", exp.Len())
	}
	if _, ok := exp.Lookup(3, 0, now.Add(time.Minute)); ok {
		t.Fatal("merged entry outlived its expiry")
	}
	// The bound holds: of three live entries a table of two keeps the two
	// most recent.
	small := New[uint64](time.Hour, 2)
	small.Merge([]Entry[uint64]{{1, Origin{Worker: "a"}, now.Add(time.Hour)}, {2, Origin{Worker: "b"}, now.Add(time.Hour)}, {3, Origin{Worker: "c"}, now.Add(time.Hour)}}, now)
	if _, ok := small.Lookup(3, 0, now); ok || small.Len() != 2 {
		t.Fatalf("bound not kept: len %d", small.Len())
	}
	// A snapshot is older than what the table learned since: on a full
	// table it fills only the room left, behind the table's own entries.
	full := New[uint64](time.Hour, 3)
	full.Learn(8, Origin{Worker: "h"}, now)
	full.Learn(9, Origin{Worker: "i"}, now)
	full.Merge([]Entry[uint64]{{1, Origin{Worker: "a"}, now.Add(time.Hour)}, {2, Origin{Worker: "b"}, now.Add(time.Hour)}}, now)
	for k, w := range map[uint64]string{8: "h", 9: "i", 1: "a"} {
		if got, ok := full.Lookup(k, 0, now); !ok || got.Worker != w {
			t.Errorf("full table, key %d: %q %v, want %q", k, got.Worker, ok, w)
		}
	}
	if _, ok := full.Lookup(2, 0, now); ok {
		t.Error("a full table took the snapshot's older entry over its own")
	}
	// Full, it still moves the expiry of a key it holds that comes after
	// one it had no room for.
	held := New[uint64](time.Hour, 1)
	held.Learn(5, Origin{Worker: "e"}, now)
	held.Merge([]Entry[uint64]{{6, Origin{Worker: "f"}, now.Add(time.Hour)}, {5, Origin{Worker: "e2"}, now.Add(3 * time.Hour)}}, now)
	if got, ok := held.Lookup(5, 0, now.Add(2*time.Hour)); !ok || got.Worker != "e2" {
		t.Errorf("held key after a refused one: %q %v, want e2 until its later expiry", got.Worker, ok)
	}
	// Expired entries do not take the room of live ones.
	stale := New[uint64](time.Minute, 2)
	stale.Learn(1, Origin{Worker: "a"}, now)
	stale.Learn(2, Origin{Worker: "b"}, now)
	stale.Merge([]Entry[uint64]{{3, Origin{Worker: "c"}, now.Add(time.Hour)}}, now.Add(2*time.Minute))
	if got, ok := stale.Lookup(3, 0, now.Add(2*time.Minute)); !ok || got.Worker != "c" {
		t.Errorf("a table full of expired entries refused a live one: %q %v", got.Worker, ok)
	}
}

// BenchmarkEntries lists a full default-size table, as a snapshot does;
// the table's lock (which Route's pinning and Complete's learning take) is
// held for the walk.
func BenchmarkEntries(b *testing.B) {
	now := time.Unix(1000, 0)
	t := New[uint64](time.Hour, DefaultMaxEntries)
	for i := range DefaultMaxEntries {
		t.Learn(uint64(i), Origin{Worker: "http://worker-7.pool.svc.cluster.local:8000"}, now)
	}
	for b.Loop() {
		if es := t.Entries(now); len(es) != DefaultMaxEntries {
			b.Fatal(len(es))
		}
	}
}

// A response belongs to the tenant that produced it: another tenant's
// lookup finds it (to refuse it) without refreshing it, so it neither keeps
// the entry alive nor saves it from eviction; an origin or an asker without
// a tenant (a node that predates tenants) is never foreign.
func TestTenantOwnsItsEntries(t *testing.T) {
	a, b := HashTenant("team-a"), HashTenant("team-b")
	if a == b || a == 0 || HashTenant("") == 0 {
		t.Fatal("HashTenant does not tell tenants apart")
	}
	if a != 0x28ab1781c2597fd8 {
		// Part of the wire protocol between data planes and the leader.
		t.Fatalf("HashTenant(team-a) = %#x changed between builds", a)
	}
	for _, c := range []struct {
		owner, asker uint64
		foreign      bool
	}{{a, a, false}, {a, b, true}, {0, b, false}, {a, 0, false}} {
		if got := (Origin{Worker: "w", Tenant: c.owner}).Foreign(c.asker); got != c.foreign {
			t.Errorf("owner %#x asked by %#x: foreign %v, want %v", c.owner, c.asker, got, c.foreign)
		}
	}
	now := time.Unix(1000, 0)
	tb := New[string](time.Minute, 2)
	tb.Learn("resp_a", Origin{Worker: "w1", Tenant: a}, now)
	tb.Learn("resp_x", Origin{Worker: "w2", Tenant: a}, now.Add(time.Second))
	o, ok := tb.Lookup("resp_a", b, now.Add(50*time.Second))
	if !ok || o.Worker != "w1" || !o.Foreign(b) {
		t.Fatalf("lookup by another tenant: %+v %v", o, ok)
	}
	// Not refreshed by that lookup: still the least recently used, and
	// expiring a minute after it was learned.
	tb.Learn("resp_y", Origin{Worker: "w3", Tenant: b}, now.Add(2*time.Second))
	if _, ok := tb.Lookup("resp_a", a, now.Add(2*time.Second)); ok {
		t.Fatal("another tenant's lookup saved the entry from eviction")
	}
	tb.Learn("resp_z", Origin{Worker: "w4", Tenant: a}, now)
	if _, ok := tb.Lookup("resp_z", b, now.Add(30*time.Second)); !ok {
		t.Fatal("entry lost")
	}
	if _, ok := tb.Lookup("resp_z", a, now.Add(61*time.Second)); ok {
		t.Fatal("another tenant's lookup extended the entry's life")
	}
}
