package engine

// Hot-prefix spreading: a prefix in most recent requests is no reason to
// prefer the worker holding it. Off at its Policy zero value.

// hotTracker estimates how often prefixes of sampled depths (1, 2, 4, ...
// blocks) occur in recent traffic, with exponential decay so the estimate
// follows the workload. A prefix in at least HotFraction of requests is
// hot: everybody should hold it, so holding it is no reason to prefer a
// worker.
type hotTracker struct {
	counts map[uint64]float64
	total  float64
	since  int // requests since the last decay
}

const (
	hotMaxDepth   = 1 << 10 // blocks
	hotDecayEvery = 256     // requests
	hotDecay      = 0.5
	hotMinTotal   = 32 // requests before anything counts as hot
)

func (t *hotTracker) observe(hashes []uint64, fraction float64) {
	if fraction <= 0 {
		return
	}
	if t.counts == nil {
		t.counts = map[uint64]float64{}
	}
	for d := 1; d <= len(hashes) && d <= hotMaxDepth; d *= 2 {
		t.counts[hashes[d-1]]++
	}
	t.total++
	t.since++
	if t.since >= hotDecayEvery {
		t.since = 0
		t.total *= hotDecay
		for k, v := range t.counts {
			if v *= hotDecay; v < 0.5 {
				delete(t.counts, k)
			} else {
				t.counts[k] = v
			}
		}
	}
}

// depth returns the deepest sampled prefix of hashes that is hot, in
// blocks (0 when none is).
func (t *hotTracker) depth(hashes []uint64, fraction float64) int {
	if fraction <= 0 || t.total < hotMinTotal {
		return 0
	}
	hot := 0
	for d := 1; d <= len(hashes) && d <= hotMaxDepth; d *= 2 {
		if t.counts[hashes[d-1]] < fraction*t.total {
			break
		}
		hot = d
	}
	return hot
}
