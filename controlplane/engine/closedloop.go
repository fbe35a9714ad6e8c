package engine

import (
	"github.com/cartrouter/cart/controlplane/index"
)

// The closed loop: reported cached tokens against the index's prediction,
// adapting each worker's modelled capacity. Off at its Policy zero value.

// Accuracy compares what the index predicted for a worker with the cached
// tokens the worker reported.
type Accuracy struct {
	Reports         uint64 // completions with a usage report
	PredictedTokens uint64 // Σ predicted cached prompt tokens
	ActualTokens    uint64 // Σ reported cached prompt tokens
	Misses          uint64 // reports far below the prediction
	ModelBlocks     int    // blocks in the worker's cache model
	// ModelCapacity is the current modelled capacity in blocks; 0 means
	// no learned or configured limit, so the model is bounded by the
	// index alone (it never holds a block the index dropped).
	ModelCapacity int
}

func (w *worker) accuracy() Accuracy {
	a := w.acc
	if w.model != nil {
		a.ModelBlocks, a.ModelCapacity = w.model.len(), w.model.capacity
	}
	return a
}

// Feedback thresholds. A report counts as a miss when the worker had less
// than missFraction of the predicted prefix cached; predictions younger
// than settleNanos are not judged, because the worker may still have been
// computing the prefix when the request arrived (engines insert blocks
// after prefill, so a burst legitimately sees fewer hits than predicted).
const (
	missFraction = 0.5
	settleNanos  = int64(2e9)
	shrinkFactor = 0.9
	growFactor   = 1.01
	minCapacity  = 64 // blocks: never model a cache smaller than this
)

// Feedback reports a completed request's usage: the worker had
// cachedTokens of promptTokens cached, where the decision predicted
// predictedChars of keyLen characters placed placedAgo nanoseconds
// earlier. With the closed loop on, a worker that had far less than
// predicted gets a smaller modelled capacity (its oldest entries are
// dropped from the index); one that keeps confirming predictions slowly
// regains capacity up to its configured size.
func (e *Engine) Feedback(url string, keyLen, predictedChars int, placedAgo int64, promptTokens, cachedTokens int) {
	w, ok := e.byURL[url]
	if !ok || promptTokens <= 0 || cachedTokens < 0 || keyLen <= 0 {
		return
	}
	// Scale characters to the worker's own token count rather than
	// assuming a fixed characters-per-token ratio.
	predicted := predictedChars * promptTokens / keyLen
	w.acc.Reports++
	w.acc.PredictedTokens += uint64(predicted)
	w.acc.ActualTokens += uint64(cachedTokens)
	// The engine's own events, while they flow, are the truth the loop
	// would only guess at.
	if !e.pol.ClosedLoop || w.model == nil || w.kv.on || predicted <= 0 || placedAgo < settleNanos {
		return
	}
	if float64(cachedTokens) < missFraction*float64(predicted) {
		w.acc.Misses++
		capacity := int(float64(w.model.len()) * shrinkFactor)
		if capacity < minCapacity {
			capacity = minCapacity
		}
		if w.model.capacity == 0 || capacity < w.model.capacity {
			w.model.capacity = capacity
		}
		e.forget(w, w.model.shrink(nil))
		return
	}
	if w.model.capacity > 0 {
		grown := int(float64(w.model.capacity)*growFactor) + 1
		if limit := e.configuredCapacity(w); limit > 0 && grown > limit {
			grown = limit
		}
		// With nothing configured, growth stops at the index's own bound:
		// beyond it a limit means nothing, and a limit grown without
		// bound would take as long to cut back on the next miss.
		if e.configuredCapacity(w) == 0 && grown >= e.idx.Ceiling() {
			grown = 0
		}
		w.model.capacity = grown
	}
}

// placedAgo returns how long ago w was sent the block hash (-1 unknown).
func (e *Engine) placedAgo(hash uint64, w index.WorkerID, now int64) int64 {
	if at, ok := e.idx.HolderAt(hash, w); ok {
		return now - at
	}
	return -1
}
