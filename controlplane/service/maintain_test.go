package service

import (
	"testing"

	"github.com/cartrouter/cart/controlplane/decider"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// The control plane's index stays bounded: a maintenance pass trims it to
// its size, so new prompts keep being recorded (without it, a full index
// would skip every new placement and affinity would silently stop).
func TestMaintenanceBoundsTheIndex(t *testing.T) {
	// Room to grow past the bound between passes, as a full pass interval
	// would give.
	cp := newTestCP(t, cpConfig{leader: true, dec: func(o *decider.Options) { o.MaxEntries, o.Headroom = 40, 1<<20 }})
	cp.addWorkers(t, w1, w2)
	rc := cp.router()
	for i := range 50 {
		route(t, rc, &cartv1.RouteRequest{Model: "m", Text: text(640, i), DataplaneId: "dp"})
	}
	before := cp.dec.Stats().IndexEntries
	if before < 100 {
		t.Fatalf("index has only %d entries", before)
	}
	cp.dec.Maintain()
	after := cp.dec.Stats().IndexEntries
	if after != 40 {
		t.Fatalf("after maintenance: %d entries, want 40", after)
	}
	// The most recent prompt survived (LRU), the oldest did not.
	if r := route(t, rc, &cartv1.RouteRequest{Model: "m", Text: text(640, 49), DryRun: true}).GetReason(); r != "cache_hit" {
		t.Fatalf("newest prompt after eviction: %s", r)
	}
	if r := route(t, rc, &cartv1.RouteRequest{Model: "m", Text: text(640, 0), DryRun: true}).GetReason(); r != "cache_miss" {
		t.Fatalf("oldest prompt after eviction: %s", r)
	}
}
