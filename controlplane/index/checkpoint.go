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
// their checkpoints only, and whose holders do not always hold a prefix's
// earlier blocks (the data plane's shadow keeps only a prefix's latest
// holder, so an older holder of a longer prompt keeps its deeper blocks
// alone). Past the first hash missing from the index it goes on from
// checkpoint to checkpoint while they are present, then probes the blocks
// before the next one for a prompt that ended between two checkpoints (its
// last block is stored). A worker is credited with a block only if it was
// credited at every block probed before it: a deeper block held by a
// worker that no longer holds the prefix says nothing about that worker's
// cache. A match found so is short of the truth by at most
// CheckpointStride-1 blocks.
func (x *Index) LookupCheckpoints(hashes []uint64, m *Match) {
	m.Reset()
	prev := 0 // the depth credited at the last block found
	probe := func(q int) bool {
		s, ok := x.byHash[hashes[q]]
		if !ok {
			return false
		}
		e := x.at(s)
		if e.nholders == 0 {
			return false
		}
		credit := func(w WorkerID) {
			if prev == 0 || m.BlocksFor(w) == prev {
				m.set(w, q+1)
				m.Longest = q + 1
			}
		}
		credit(e.first.w)
		for _, hd := range e.more {
			credit(hd.w)
		}
		prev = q + 1
		return true
	}
	p := 0
	for p < len(hashes) && probe(p) {
		p++
	}
	for q := NextCheckpoint(p); q < len(hashes) && probe(q); q = NextCheckpoint(q + 1) {
		p = q + 1
	}
	for q := min(NextCheckpoint(p), len(hashes)) - 1; q >= p; q-- {
		if probe(q) {
			break
		}
	}
}
