package index

import (
	"slices"
	"testing"
)

func TestCheckpoints(t *testing.T) {
	var hashes []uint64
	for i := range 40 {
		hashes = append(hashes, uint64(100+i))
	}
	got := Checkpoints(nil, hashes)
	want := []uint64{100, 101, 102, 103, 104, 105, 106, 107, 115, 123, 131, 139}
	if !slices.Equal(got, want) {
		t.Fatalf("Checkpoints(40 blocks) = %v, want %v", got, want)
	}
	// The last block is a checkpoint whatever its position.
	if got := Checkpoints(nil, hashes[:13]); !slices.Equal(got, []uint64{100, 101, 102, 103, 104, 105, 106, 107, 112}) {
		t.Fatalf("Checkpoints(13 blocks) = %v", got)
	}
	if got := Checkpoints(nil, nil); len(got) != 0 {
		t.Fatalf("Checkpoints(nil) = %v", got)
	}
	for _, c := range []struct{ p, want int }{{0, 0}, {7, 7}, {8, 15}, {15, 15}, {16, 23}, {22, 23}, {23, 23}, {24, 31}} {
		if got := NextCheckpoint(c.p); got != c.want {
			t.Errorf("NextCheckpoint(%d) = %d, want %d", c.p, got, c.want)
		}
		if !IsCheckpoint(NextCheckpoint(c.p), 1000) {
			t.Errorf("NextCheckpoint(%d) is not a checkpoint", c.p)
		}
	}
}

func TestLookupCheckpoints(t *testing.T) {
	path := func(n int, base uint64) []uint64 {
		var h []uint64
		for i := range n {
			h = append(h, base+uint64(i))
		}
		return h
	}
	cases := []struct {
		name   string
		stored []uint64 // recorded for worker 1 by checkpoints only
		full   []uint64 // recorded for worker 2 in full
		query  []uint64
		want1  int // blocks credited to worker 1
		want2  int
	}{
		{"checkpoints of a longer prompt", path(40, 0), nil, path(30, 0), 24, 0},
		{"prompt ended between checkpoints", path(13, 0), nil, path(30, 0), 13, 0},
		{"query shorter than the stored prompt", path(40, 0), nil, path(5, 0), 5, 0},
		{"query ending between checkpoints", path(40, 0), nil, path(20, 0), 16, 0},
		{"nothing stored", nil, nil, path(20, 0), 0, 0},
		{"other prompt", path(40, 1000), nil, path(20, 0), 0, 0},
		{"full path still wins where it is deeper", path(9, 0), path(30, 0), path(30, 0), 9, 30},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x := New(Options{MaxEntries: 1000, InlineEvict: true})
			if c.stored != nil {
				x.Insert(Checkpoints(nil, c.stored), 1, 1)
			}
			if c.full != nil {
				x.Insert(c.full, 2, 2)
			}
			var m Match
			x.LookupCheckpoints(c.query, &m)
			if got := m.BlocksFor(1); got != c.want1 {
				t.Errorf("worker 1: %d blocks, want %d", got, c.want1)
			}
			if got := m.BlocksFor(2); got != c.want2 {
				t.Errorf("worker 2: %d blocks, want %d", got, c.want2)
			}
			if want := max(c.want1, c.want2); m.Longest != want {
				t.Errorf("Longest %d, want %d", m.Longest, want)
			}
		})
	}
}
