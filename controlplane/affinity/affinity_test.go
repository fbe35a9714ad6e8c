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
