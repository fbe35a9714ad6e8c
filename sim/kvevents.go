package sim

import (
	"encoding/binary"

	"github.com/cartrouter/cart/kvevents"
)

// KVEventSink receives the prefix cache's changes as vLLM's KV events, one
// call per change, in the order the changes happened. Publish is called with
// the cache locked, so it must not block; a *kvevents.Publisher qualifies.
type KVEventSink interface {
	Publish(events []kvevents.Event)
}

// cacheChanged reports a prompt's insertion: one BlockStored per run of
// consecutive new blocks (its parent the block before the run), then one
// BlockRemoved with every evicted block, so a consumer applying them in
// order ends with the cache's content.
func (s *Server) cacheChanged(j *job) func(added []int, evicted []uint64) {
	if s.cfg.KVEvents == nil {
		return nil
	}
	return func(added []int, evicted []uint64) {
		var events []kvevents.Event
		for start := 0; start < len(added); {
			end := start + 1
			for end < len(added) && added[end] == added[end-1]+1 {
				end++
			}
			first, last := added[start], added[end-1]
			ev := kvevents.Event{
				Kind:        kvevents.BlockStored,
				BlockHashes: j.hashes[first : last+1],
				TokenIDs:    tokenIDs(j.prompt, first*s.cfg.BlockTokens, (last+1)*s.cfg.BlockTokens),
				BlockSize:   s.cfg.BlockTokens,
				Medium:      kvevents.MediumGPU,
				LoRAName:    j.adapter,
			}
			if first > 0 {
				parent := j.hashes[first-1]
				ev.ParentBlockHash = &parent
			}
			events = append(events, ev)
			start = end
		}
		if len(evicted) > 0 {
			events = append(events, kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: evicted, Medium: kvevents.MediumGPU})
		}
		s.cfg.KVEvents.Publish(events)
	}
}

// cacheCleared reports a reset, as an engine reports a cache reset.
func (s *Server) cacheCleared() func() {
	if s.cfg.KVEvents == nil {
		return nil
	}
	return func() { s.cfg.KVEvents.Publish([]kvevents.Event{{Kind: kvevents.AllBlocksCleared}}) }
}

// tokenIDs returns stand-in ids for tokens [from, to) of a prompt: each
// token's 4 bytes read little-endian, zero-padded past the end. For a
// token-id completions prompt these are the client's own ids.
func tokenIDs(prompt []byte, from, to int) []uint32 {
	out := make([]uint32, 0, to-from)
	for t := from; t < to; t++ {
		var tok [bytesPerToken]byte
		if off := t * bytesPerToken; off < len(prompt) {
			copy(tok[:], prompt[off:])
		}
		out = append(out, binary.LittleEndian.Uint32(tok[:]))
	}
	return out
}
