package engine

import (
	"slices"
	"testing"
)

// Decision.Touched is the prefix the chosen worker already held (whose
// recency the decision refreshed), never the blocks it placed; a dry run
// refreshes nothing.
func TestDecisionTouched(t *testing.T) {
	e := newTestEngine(t, testPolicy(), urls("a")...)
	short, long := textOf(40, 1), textOf(40, 1)+textOf(60, 2)
	d, err := e.Choose(req(short), 1)
	if err != nil || d.Touched != nil {
		t.Fatalf("first route: touched %v, err %v", d.Touched, err)
	}
	r := req(long)
	if d, _ := e.Choose(Request{Hashes: r.Hashes, KeyLen: r.KeyLen, DryRun: true}, 2); d.Touched != nil {
		t.Fatalf("dry run touched %v", d.Touched)
	}
	d, err = e.Choose(r, 3)
	if err != nil || !slices.Equal(d.Touched, r.Hashes[:4]) || !slices.Equal(d.Placed, r.Hashes[4:]) {
		t.Fatalf("extension: touched %d placed %d blocks (err %v), want 4 and %d", len(d.Touched), len(d.Placed), err, len(r.Hashes)-4)
	}
}
