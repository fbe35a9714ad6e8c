package index

// A resumable walk from the least to the most recently used entry, taken
// in bounded steps with the index changing in between (the engine seeds a
// worker's cache model with it without a pass over the index under the
// routing lock). Walk cannot do that: its cursor would be stale after any
// change.
//
// The walk keeps the last entry it visited (upLast). Every entry between
// the tail and upLast has been visited; unlink keeps that true by moving
// upLast to its older neighbour when upLast itself moves or goes. An
// entry moved to the front lands ahead of the walk, so it is visited (again)
// before the walk reaches the head: nothing present at the start and still
// present is missed, whatever the changes, and on an unchanged index the
// walk is Walk's order reversed.

// StartWalkUp begins a walk at the least recently used entry, abandoning
// any walk in progress.
func (x *Index) StartWalkUp() {
	x.upOn = true
	x.upLast = nilSlot
}

// WalkUpStep visits up to limit more entries of the walk, towards the most
// recently used, calling fn with each one's hash and holders (valid only
// during the call). done reports that the walk passed the head and ended.
// ok is false when no walk is in progress: none was started, it ended, or
// Reset, Clear or PutBack ended it (the caller starts over).
func (x *Index) WalkUpStep(limit int, fn func(hash uint64, holders []Holder)) (done, ok bool) {
	if !x.upOn {
		return false, false
	}
	for range max(limit, 1) {
		s := x.tail
		if x.upLast != nilSlot {
			s = x.at(x.upLast).prev
		}
		if s == nilSlot {
			x.upOn = false
			x.upLast = nilSlot
			return true, true
		}
		e := x.at(s)
		if e.nholders > 0 {
			x.upBuf = e.appendHolders(x.upBuf[:0])
			fn(e.hash, x.upBuf)
		}
		x.upLast = s
	}
	return false, true
}

// endWalkUp ends the walk: the caller sees ok false and starts over.
func (x *Index) endWalkUp() {
	x.upOn = false
	x.upLast = nilSlot
}
