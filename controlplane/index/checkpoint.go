package index

// A prompt's placement can be told to another party in a fraction of its
// block hashes, because each chained hash identifies the whole prefix up
// to it: the checkpoints are every position below CheckpointStride, then
// every CheckpointStride-th, and the last. A receiver that stores only
// those finds a prefix match to within CheckpointStride-1 blocks by probing
// the same positions of its own prompt (see NextCheckpoint). Used by the
// leader's peer feed to data planes' shadow indexes.
const CheckpointStride = 8

// IsCheckpoint reports whether position p (0-based) of an n-block prompt
// is a checkpoint.
func IsCheckpoint(p, n int) bool {
	return p < CheckpointStride || p%CheckpointStride == CheckpointStride-1 || p == n-1
}

// Checkpoints appends the checkpoint hashes of hashes to dst.
func Checkpoints(dst, hashes []uint64) []uint64 {
	for p, h := range hashes {
		if IsCheckpoint(p, len(hashes)) {
			dst = append(dst, h)
		}
	}
	return dst
}

// NextCheckpoint is the first stride checkpoint at or after p (the
// positions every prompt shares, whatever its length).
func NextCheckpoint(p int) int {
	if p < CheckpointStride {
		return p
	}
	return p + (CheckpointStride-1-p%CheckpointStride+CheckpointStride)%CheckpointStride
}

// LookupCheckpoints is Lookup for an index that also stores prompts by
// their checkpoints only: past the first hash missing from the index it
// goes on from checkpoint to checkpoint while they are present, then
// probes the blocks before the next one for a prompt that ended between
// two checkpoints (its last block is stored). Every holder of a block
// found is credited with it, as Lookup does. A match found so is short of
// the truth by at most CheckpointStride-1 blocks.
func (x *Index) LookupCheckpoints(hashes []uint64, m *Match) {
	x.Lookup(hashes, m)
	p := m.Longest
	for q := NextCheckpoint(p); q < len(hashes) && x.creditAt(hashes, q, m); q = NextCheckpoint(q + 1) {
		p = q + 1
	}
	for q := min(NextCheckpoint(p), len(hashes)) - 1; q >= p; q-- {
		if x.creditAt(hashes, q, m) {
			break
		}
	}
}

// creditAt credits every holder of block q with q+1 blocks; false when the
// block is not stored. LookupSince does the same inline: made a shared
// call, it slowed BenchmarkLookup by 10-20% on the routing lock's path.
func (x *Index) creditAt(hashes []uint64, q int, m *Match) bool {
	s, ok := x.find(hashes[q])
	if !ok {
		return false
	}
	e := x.at(s)
	if e.nholders == 0 {
		return false
	}
	m.set(e.first.w, q+1)
	for _, hd := range e.more {
		m.set(hd.w, q+1)
	}
	m.Longest = q + 1
	return true
}
