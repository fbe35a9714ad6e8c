package index

// PutBack adds an entry at the least-recently-used end of the index with
// the given holders, for rebuilding an index from a snapshot that Walk
// wrote (most to least recently used: PutBack in the same order restores
// the LRU order). An existing entry for hash is replaced. It ignores the
// size ceiling: a snapshot was within bounds when it was taken.
func (x *Index) PutBack(hash uint64, used int64, holders []Holder) {
	if len(holders) == 0 {
		return
	}
	// An entry linked at the tail would be behind a walk in progress.
	x.endWalkUp()
	if s, ok := x.find(hash); ok {
		x.released(s)
		x.drop(s)
	}
	s := x.alloc(hash)
	e := x.mut(s)
	e.used = used
	for _, h := range holders {
		e.addHolder(h.Worker, h.At)
	}
	// Link at the tail.
	e.prev = x.tail
	e.next = nilSlot
	if x.tail != nilSlot {
		x.mut(x.tail).next = s
	}
	x.tail = s
	if x.head == nilSlot {
		x.head = s
	}
}
