package state

import (
	"iter"

	"github.com/cartrouter/cart/controlplane/engine"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// applyBlockBudget bounds the blocks one lock hold applies from a batch:
// what a single routing decision may insert (engine.MaxRouteBlocks), so a
// batch never keeps Route waiting longer than the longest decision would.
// Counting placements alone did not bound it: 32 placements of long
// prompts are tens of thousands of blocks.
const applyBlockBudget = engine.MaxRouteBlocks

// placementSteps cuts ps into consecutive runs of at most placementChunk
// placements and applyBlockBudget blocks, each applied under one lock
// hold. A placement is never split (its blocks are inserted leaf first,
// root last, in one call), so one larger than the budget is a run of its
// own; the leader never proposes one, since decisions stop at
// MaxRouteBlocks.
func placementSteps(ps []*cartv1.Placement) iter.Seq[[]*cartv1.Placement] {
	return func(yield func([]*cartv1.Placement) bool) {
		for start := 0; start < len(ps); {
			end, blocks := start, 0
			for end < len(ps) && end-start < placementChunk {
				n := len(ps[end].GetBlockHashes())
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
