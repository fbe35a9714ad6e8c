package router

import (
	"context"
	"testing"

	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
)

// The all-in-one router seeds an unmodelled worker's model when its first
// KV report arrives: a capacity below what the index holds forgets the
// oldest holdings, and an eviction reported in the same report is trimmed
// once the seed is complete.
func TestLocalKVReportSeedsTheModel(t *testing.T) {
	holds := func(l *Local, text string) int {
		var n int
		l.dec.Do(decider.OpRead, func(eng *engine.Engine) {
			var m index.Match
			eng.Index().Lookup(request(text).Hashes, &m)
			id, _ := eng.WorkerIDOf("a")
			n = m.BlocksFor(index.WorkerID(id))
		})
		return n
	}
	texts := []string{"0123456789abcdef", "ghijklmnopqrstuv", "wxyzABCDEFGHIJKL"} // 4 blocks each, oldest first
	for _, evicted := range []bool{false, true} {
		l := newTestLocal("a")
		for _, s := range texts {
			d, err := l.Route(context.Background(), request(s))
			if err != nil {
				t.Fatal(err)
			}
			l.Done(d, Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1})
		}
		// Capacity 8: the oldest prompt is forgotten by the seeded model.
		// Evicted down to 4: the next oldest goes too.
		l.ApplyKVReport("a", engine.KVReport{Synced: true, OccupiedBlocks: 4, CapacityBlocks: 8, Evicted: evicted})
		want := []int{0, 4, 4}
		if evicted {
			want[1] = 0
		}
		for i, s := range texts {
			if got := holds(l, s); got != want[i] {
				t.Fatalf("evicted=%v: prompt %d held for %d blocks, want %d", evicted, i, got, want[i])
			}
		}
	}
}
