package index

import "testing"

func TestCapacityBlocks(t *testing.T) {
	for _, tt := range []struct {
		tokens     int64
		blockChars int
		want       int
	}{
		{0, 64, 0},           // unbounded
		{-5, 64, 0},          // nonsense: unbounded rather than negative
		{1000, 0, 0},         // no block size: unbounded
		{1, 64, 1},           // smaller than a block still holds one
		{16, 64, 1},          // exactly one block of 4-char tokens
		{1 << 20, 64, 65536}, // 4 MiB of text in 64-char blocks
		{100, 3, 133},        // rounds down
	} {
		if got := CapacityBlocks(tt.tokens, tt.blockChars); got != tt.want {
			t.Errorf("CapacityBlocks(%d, %d) = %d, want %d", tt.tokens, tt.blockChars, got, tt.want)
		}
	}
}
