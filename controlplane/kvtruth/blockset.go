package kvtruth

// DefaultMaxHashesPerRank bounds the block hashes kept per engine rank when
// kv_events.max_hashes_per_rank is not set. A GPU holds tens of thousands
// of 16-token blocks (an 80 GB card and an 8B model: about 50K); SGLang
// with page size 1 reports a block per token, several hundred thousand.
const DefaultMaxHashesPerRank = 1_000_000

// blockSet is one engine rank's block hashes, bounded: beyond max the
// oldest stored goes first, so a flood of BlockStored events (forged, or an
// engine larger than the cap) costs at most max entries (about 36 bytes
// each: BenchmarkStoredFlood).
type blockSet struct {
	max int
	at  map[uint64]int32 // hash → its node
	// nodes is a list in store order (head the oldest) threaded through a
	// slab whose free nodes are reused, so it never exceeds max+1 nodes.
	nodes      []setNode
	head, tail int32
	free       int32
}

type setNode struct {
	hash       uint64
	prev, next int32
}

const none int32 = -1

func newBlockSet(max int) *blockSet {
	return &blockSet{max: max, at: map[uint64]int32{}, head: none, tail: none, free: none}
}

func (s *blockSet) len() int { return len(s.at) }

func (s *blockSet) has(h uint64) bool {
	_, ok := s.at[h]
	return ok
}

// add stores h (a no-op when held, then added is false) and returns how
// many of the oldest hashes it pushed out.
func (s *blockSet) add(h uint64) (added bool, dropped int) {
	if _, ok := s.at[h]; ok {
		return false, 0
	}
	i := s.free
	if i != none {
		s.free = s.nodes[i].next
	} else {
		i = int32(len(s.nodes))
		s.nodes = append(s.nodes, setNode{})
	}
	s.nodes[i] = setNode{hash: h, prev: s.tail, next: none}
	if s.tail != none {
		s.nodes[s.tail].next = i
	} else {
		s.head = i
	}
	s.tail = i
	s.at[h] = i
	for len(s.at) > s.max {
		s.remove(s.nodes[s.head].hash)
		dropped++
	}
	return true, dropped
}

// remove drops h and reports whether it was held.
func (s *blockSet) remove(h uint64) bool {
	i, ok := s.at[h]
	if !ok {
		return false
	}
	delete(s.at, h)
	n := s.nodes[i]
	if n.prev != none {
		s.nodes[n.prev].next = n.next
	} else {
		s.head = n.next
	}
	if n.next != none {
		s.nodes[n.next].prev = n.prev
	} else {
		s.tail = n.prev
	}
	s.nodes[i] = setNode{next: s.free}
	s.free = i
	return true
}

func (s *blockSet) clear() {
	clear(s.at)
	s.nodes = s.nodes[:0]
	s.head, s.tail, s.free = none, none, none
}
