package router

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
)

func newTestLocal(now *time.Time, maxEntries, hour int) *Local {
	return NewLocal(LocalOptions{
		Policy:      engine.Policy{Threshold: 0.3, BalanceAbsThreshold: 64, BalanceRelThreshold: 1.5, BlockChars: 4},
		MaxEntries:  maxEntries,
		CleanupHour: hour,
		Seed:        1,
		Now:         func() time.Time { return *now },
	}, []engine.WorkerSpec{{URL: "a"}, {URL: "b"}})
}

func route(t *testing.T, l *Local, text string) Decision {
	t.Helper()
	d, err := l.Route(context.Background(), &Request{Hashes: index.Hash(nil, "m", []byte(text), 4), KeyLen: len(text)})
	if err != nil {
		t.Fatal(err)
	}
	l.Done(d, Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1})
	return d
}

func TestEvictPassTrimsToBound(t *testing.T) {
	now := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	l := newTestLocal(&now, 100, -1)
	for i := range 40 {
		route(t, l, fmt.Sprintf("prompt number %04d with some text", i)) // 9 blocks each
	}
	st, _ := l.IndexStats()
	if st.Entries <= 100 {
		t.Fatalf("index did not grow past its bound between passes: %d", st.Entries)
	}
	removed := l.EvictPass()
	st, _ = l.IndexStats()
	if st.Entries != 100 || removed <= 0 {
		t.Fatalf("after the pass: %d entries, %d removed", st.Entries, removed)
	}
	// The newest prompt survived.
	if d := route(t, l, "prompt number 0039 with some text"); d.Reason != string(engine.ReasonCacheHit) {
		t.Fatalf("newest prompt after eviction: %s", d.Reason)
	}
}

func TestDailyResetAtItsHour(t *testing.T) {
	now := time.Date(2026, 1, 1, 2, 30, 0, 0, time.UTC)
	l := newTestLocal(&now, 1000, 3)
	route(t, l, "a prompt that should be forgotten at three")
	l.EvictPass()
	if st, _ := l.IndexStats(); st.Entries == 0 {
		t.Fatal("reset before its hour")
	}
	now = now.Add(time.Hour) // 03:30
	l.EvictPass()
	if st, _ := l.IndexStats(); st.Entries != 0 {
		t.Fatalf("no reset after 03:00: %d entries", st.Entries)
	}
	route(t, l, "a prompt after the reset")
	now = now.Add(time.Hour) // 04:30 the same day: no second reset
	l.EvictPass()
	if st, _ := l.IndexStats(); st.Entries == 0 {
		t.Fatal("reset twice in one day")
	}
}
