package decider

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/engine"
)

func TestMaintainTrimsToBound(t *testing.T) {
	now := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	d := newTestDecider(&now, 100, -1)
	for i := range 40 {
		route(t, d, fmt.Sprintf("prompt number %04d with some text", i)) // 9 blocks each
	}
	st, _ := d.IndexStats()
	if st.Entries <= 100 {
		t.Fatalf("index did not grow past its bound between passes: %d", st.Entries)
	}
	removed := d.Maintain()
	st, _ = d.IndexStats()
	if st.Entries != 100 || removed <= 0 {
		t.Fatalf("after the pass: %d entries, %d removed", st.Entries, removed)
	}
	// The newest prompt survived.
	if dec := route(t, d, "prompt number 0039 with some text"); dec.Reason != engine.ReasonCacheHit {
		t.Fatalf("newest prompt after eviction: %s", dec.Reason)
	}
	if holdCount(t, d, OpMaintain) == 0 {
		t.Fatal("maintenance steps were not timed")
	}
}

func TestDailyResetAtItsHour(t *testing.T) {
	for _, presize := range []bool{false, true} {
		t.Run(fmt.Sprintf("presize=%v", presize), func(t *testing.T) {
			now := time.Date(2026, 1, 1, 2, 30, 0, 0, time.UTC)
			d := newTestDecider(&now, 1000, 3)
			d.o.PresizeIndex = presize // the reset's map is reserved before the lock
			route(t, d, "a prompt that should be forgotten at three")
			d.Maintain()
			if st, _ := d.IndexStats(); st.Entries == 0 {
				t.Fatal("reset before its hour")
			}
			now = now.Add(time.Hour) // 03:30
			d.Maintain()
			if st, _ := d.IndexStats(); st.Entries != 0 {
				t.Fatalf("no reset after 03:00: %d entries", st.Entries)
			}
			route(t, d, "a prompt after the reset")
			if dec := route(t, d, "a prompt after the reset"); dec.Reason != engine.ReasonCacheHit {
				t.Fatalf("prompt placed after the reset: %s", dec.Reason)
			}
			now = now.Add(time.Hour) // 04:30 the same day: no second reset
			d.Maintain()
			if st, _ := d.IndexStats(); st.Entries == 0 {
				t.Fatal("reset twice in one day")
			}
		})
	}
}

// Expiry runs in the same pass: a placement past the TTL stops counting
// as a match after Maintain, in every host.
func TestMaintainExpiresPastTTL(t *testing.T) {
	now := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	d := New(Options{
		Policy:     engine.Policy{Threshold: 0.3, BalanceAbsThreshold: 64, BalanceRelThreshold: 1.5, BlockChars: 4, TTL: int64(time.Minute)},
		MaxEntries: 1000,
		Now:        func() time.Time { return now },
	})
	d.SetWorkers([]engine.WorkerSpec{{URL: "a"}, {URL: "b"}})
	route(t, d, "an old prompt with some text")
	now = now.Add(2 * time.Minute)
	d.Maintain()
	if st, _ := d.IndexStats(); st.Entries != 0 {
		t.Fatalf("%d entries past the TTL survived the pass", st.Entries)
	}
}

// A snapshot's record count does not size the reserved map beyond the
// index's bound: the index would never fill the rest.
func TestReserveIndexStopsAtTheBound(t *testing.T) {
	now := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	d := newTestDecider(&now, 100, -1)
	if d.ReserveIndex(0) != nil {
		t.Fatal("reserved a map for no entries")
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	r := d.ReserveIndex(10_000_000) // about 200 MB if not capped
	runtime.ReadMemStats(&after)
	if r == nil {
		t.Fatal("nothing reserved for a snapshot's records")
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
		t.Fatalf("reserved %d bytes for an index of at most %d entries", n, d.ceiling)
	}
}

// An index that fills half of its headroom gets a pass at once, not at the
// next interval: without it every new block past the bound is skipped
// until then (a minute by default), and new prompts are forgotten.
func TestPressureStartsAPassBeforeTheInterval(t *testing.T) {
	now := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	d := newTestDecider(&now, 200, -1) // headroom 25: a pass is asked for past 212 entries
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		d.Run(ctx, time.Hour)
	}()
	defer func() { cancel(); <-ran }()

	for i := range 100 {
		route(t, d, fmt.Sprintf("prompt number %04d with some text", i)) // 5 new blocks each (4 shared)
		// Wait for the pass the prompt may have asked for, so that the next
		// one finds room: a test of the trigger, not of the pass's speed.
		deadline := time.Now().Add(10 * time.Second)
		for {
			st, _ := d.IndexStats()
			if st.Entries <= 212 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after prompt %d the index holds %d entries and no pass brought it back", i, st.Entries)
			}
			time.Sleep(time.Millisecond)
		}
	}
	st, _ := d.IndexStats()
	if st.SkippedInserts != 0 {
		t.Fatalf("%d new blocks skipped although each pass had time to run", st.SkippedInserts)
	}
	// Each pass evicts down to 200, so the next is asked for only after
	// at least 13 more entries: no more passes than that allows (a kick
	// while a pass still evicts would start a second, empty one).
	if p := d.PressurePasses(); p == 0 || st.Evicted == 0 || p > st.Evicted/13+1 {
		t.Fatalf("passes asked for: %d, evicted: %d", p, st.Evicted)
	}
	if dec := route(t, d, "prompt number 0099 with some text"); dec.Reason != engine.ReasonCacheHit {
		t.Fatalf("newest prompt: %s", dec.Reason)
	}
}
