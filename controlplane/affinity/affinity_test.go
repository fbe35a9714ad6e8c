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
		a.Learn(fmt.Sprint("resp_", i), "w", now)
	}
	if a.Len() != 3 {
		t.Fatalf("len %d, want 3", a.Len())
	}
	if _, ok := a.Lookup("resp_0", now); ok {
		t.Fatal("oldest id kept past max_entries")
	}
	// A lookup makes an id recent: it survives the next insertions.
	if _, ok := a.Lookup("resp_2", now); !ok {
		t.Fatal("resp_2 lost")
	}
	a.Learn("resp_5", "w", now)
	a.Learn("resp_6", "w", now)
	if _, ok := a.Lookup("resp_2", now); !ok {
		t.Fatal("recently used id evicted before older ones")
	}
	// Expired entries go when the table is next written.
	later := now.Add(2 * time.Hour)
	a.Learn("resp_7", "w", later)
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
	src.Learn(1, "a", now)
	src.Learn(2, "b", now.Add(time.Second))
	src.Learn(3, "c", now.Add(2*time.Second))
	src.Lookup(1, now.Add(3*time.Second)) // 1 is the most recently used now
	es := src.Entries(now.Add(3 * time.Second))
	want := []Entry[uint64]{
		{1, "a", now.Add(3*time.Second + time.Minute)},
		{3, "c", now.Add(2*time.Second + time.Minute)},
		{2, "b", now.Add(time.Second + time.Minute)},
	}
	if fmt.Sprint(es) != fmt.Sprint(want) {
		t.Fatalf("entries %v, want %v", es, want)
	}
	if got := src.Entries(now.Add(time.Minute + 1500*time.Millisecond)); len(got) != 2 {
		t.Fatalf("expired entry listed: %v", got)
	}

	dst := New[uint64](time.Minute, 10)
	dst.Learn(9, "known", now)
	dst.Learn(1, "stale", now.Add(-30*time.Second)) // expires before the merged one
	later := now.Add(59 * time.Second)              // 9 still live; 2 not yet expired
	dst.Merge(es, later)
	for k, w := range map[uint64]string{1: "a", 2: "b", 3: "c", 9: "known"} {
		if got, ok := dst.Lookup(k, later); !ok || got != w {
			t.Errorf("key %d: %q %v, want %q", k, got, ok, w)
		}
	}
	// Expiry is kept, not renewed: a merged entry goes when its own time
	// comes, and one already expired is not merged.
	exp := New[uint64](time.Minute, 10)
	exp.Merge([]Entry[uint64]{{3, "c", now.Add(time.Minute)}, {4, "d", now}}, now)
	if exp.Len() != 1 {
		t.Fatalf("an expired entry was merged: len %d", exp.Len())
	}
	if _, ok := exp.Lookup(3, now.Add(time.Minute)); ok {
		t.Fatal("merged entry outlived its expiry")
	}
	// The bound holds: of three live entries a table of two keeps the two
	// most recent.
	small := New[uint64](time.Hour, 2)
	small.Merge([]Entry[uint64]{{1, "a", now.Add(time.Hour)}, {2, "b", now.Add(time.Hour)}, {3, "c", now.Add(time.Hour)}}, now)
	if _, ok := small.Lookup(3, now); ok || small.Len() != 2 {
		t.Fatalf("bound not kept: len %d", small.Len())
	}
	// A snapshot is older than what the table learned since: on a full
	// table it fills only the room left, behind the table's own entries.
	full := New[uint64](time.Hour, 3)
	full.Learn(8, "h", now)
	full.Learn(9, "i", now)
	full.Merge([]Entry[uint64]{{1, "a", now.Add(time.Hour)}, {2, "b", now.Add(time.Hour)}}, now)
	for k, w := range map[uint64]string{8: "h", 9: "i", 1: "a"} {
		if got, ok := full.Lookup(k, now); !ok || got != w {
			t.Errorf("full table, key %d: %q %v, want %q", k, got, ok, w)
		}
	}
	if _, ok := full.Lookup(2, now); ok {
		t.Error("a full table took the snapshot's older entry over its own")
	}
	// Full, it still moves the expiry of a key it holds that comes after
	// one it had no room for.
	held := New[uint64](time.Hour, 1)
	held.Learn(5, "e", now)
	held.Merge([]Entry[uint64]{{6, "f", now.Add(time.Hour)}, {5, "e2", now.Add(3 * time.Hour)}}, now)
	if got, ok := held.Lookup(5, now.Add(2*time.Hour)); !ok || got != "e2" {
		t.Errorf("held key after a refused one: %q %v, want e2 until its later expiry", got, ok)
	}
	// Expired entries do not take the room of live ones.
	stale := New[uint64](time.Minute, 2)
	stale.Learn(1, "a", now)
	stale.Learn(2, "b", now)
	stale.Merge([]Entry[uint64]{{3, "c", now.Add(time.Hour)}}, now.Add(2*time.Minute))
	if got, ok := stale.Lookup(3, now.Add(2*time.Minute)); !ok || got != "c" {
		t.Errorf("a table full of expired entries refused a live one: %q %v", got, ok)
	}
}

// BenchmarkEntries lists a full default-size table, as a snapshot does;
// the table's lock (which Route's pinning and Complete's learning take) is
// held for the walk.
func BenchmarkEntries(b *testing.B) {
	now := time.Unix(1000, 0)
	t := New[uint64](time.Hour, DefaultMaxEntries)
	for i := range DefaultMaxEntries {
		t.Learn(uint64(i), "http://worker-7.pool.svc.cluster.local:8000", now)
	}
	for b.Loop() {
		if es := t.Entries(now); len(es) != DefaultMaxEntries {
			b.Fatal(len(es))
		}
	}
}
