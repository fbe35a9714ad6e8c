package config

import "testing"

// The default block size is a measured choice (bench/results/2026-12-01-
// blocksize: 128 against 64 and 256) and the wire format of a prefix:
// changing it changes every hash, so it must not drift by accident.
func TestDefaultBlockChars(t *testing.T) {
	if got := Default().Cache.BlockChars; got != 128 {
		t.Errorf("cache.block_chars default %d, want 128", got)
	}
}
