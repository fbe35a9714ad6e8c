package state

import (
	"iter"
)

// applyBlockBudget bounds the blocks one lock hold applies from a batch.
// Measured (BenchmarkDecideUnderLoad, CPU time of the holding thread on a
// full 1M-entry index, busy 2-core box): inserting costs 1-2 µs per block
// there, more while a snapshot's frozen view makes writes copy pages, so
// 128 blocks keep a hold well under a millisecond. Counting placements
// alone did not bound it: 32 placements of long prompts are tens of
// thousands of blocks.
const applyBlockBudget = 128

// placementSteps cuts ps into consecutive runs of at most placementChunk
// placements and applyBlockBudget blocks, each applied under one lock
// hold. A placement is never split (its blocks are inserted leaf first,
// root last, in one call, which is what keeps ancestors more recent than
// their descendants and the shallowest blocks when the index is full), so
// one larger than the budget is a run of its own: at most
// engine.MaxRouteBlocks, the work of one decision of the longest prompt.
func placementSteps(ps []placement) iter.Seq[[]placement] {
	return func(yield func([]placement) bool) {
		for start := 0; start < len(ps); {
			end, blocks := start, 0
			for end < len(ps) && end-start < placementChunk {
				n := len(ps[end].hashes)
				if end > start && blocks+n > applyBlockBudget {
					break
				}
				blocks += n
				end++
			}
			if !yield(ps[start:end]) {
				return
			}
			start = end
		}
	}
}
