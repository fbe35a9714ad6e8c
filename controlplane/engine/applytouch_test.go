package engine

import (
	"slices"
	"testing"
)

// ApplyTouch refreshes the leading blocks the worker still holds, to the
// touch's time, adds no holding, and returns the blocks refreshed.
func TestApplyTouch(t *testing.T) {
	h := req(textOf(80, 0)).Hashes // 8 blocks
	cases := []struct {
		name   string
		url    string
		hashes []uint64
		want   int // blocks refreshed; -1: nil (unknown worker)
	}{
		{"held prefix of a longer path", "a", h[:6], 3},
		{"all held", "b", h[:5], 5},
		{"first block not held", "a", h[3:5], 0},
		{"gap", "a", append([]uint64{h[0], h[4]}, h[1:3]...), 1},
		{"unknown worker", "z", h[:3], -1},
		{"nothing", "a", nil, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newTestEngine(t, testPolicy(), urls("a", "b")...)
			e.ApplyPlacement("a", h[:3], 10)
			e.ApplyPlacement("b", h[:5], 10)
			got := e.ApplyTouch(c.url, c.hashes, 50)
			if c.want < 0 {
				if got != nil {
					t.Fatalf("got %v, want nil", got)
				}
				return
			}
			if !slices.Equal(got, c.hashes[:c.want]) {
				t.Fatalf("refreshed %d blocks (%v), want the first %d of %v", len(got), got, c.want, c.hashes)
			}
			for i, x := range h {
				for url, n := range map[string]int{"a": 3, "b": 5} {
					at, ok := e.idx.HolderAt(x, idOf(t, e, url))
					wantAt := int64(10)
					if url == c.url && slices.Contains(got, x) {
						wantAt = 50
					}
					if ok != (i < n) || (ok && at != wantAt) {
						t.Fatalf("block %d of %s: held %v at %d, want held %v at %d", i, url, ok, at, i < n, wantAt)
					}
				}
			}
		})
	}
}
