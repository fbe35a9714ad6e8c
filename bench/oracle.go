package bench

import (
	"container/list"
	"encoding/binary"
	"hash/fnv"
)

// Message is one chat message as sent to the endpoint.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// RenderChat renders messages the way cart-sim's chat template does
// ("<|role|>\ncontent\n" per message, then "<|assistant|>\n"), so the oracle
// sees the same bytes, token counts and blocks as the replicas.
func RenderChat(msgs []Message) []byte {
	n := len("<|assistant|>\n")
	for _, m := range msgs {
		n += len(m.Role) + len(m.Content) + 6
	}
	out := make([]byte, 0, n)
	for _, m := range msgs {
		out = append(out, "<|"...)
		out = append(out, m.Role...)
		out = append(out, "|>\n"...)
		out = append(out, m.Content...)
		out = append(out, '\n')
	}
	return append(out, "<|assistant|>\n"...)
}

// PromptTokens is the replica's token count of a rendered prompt.
func PromptTokens(rendered []byte) int {
	return (len(rendered) + BytesPerToken - 1) / BytesPerToken
}

// BlockHashes returns the chained hash of every full blockTokens-token block
// of a rendered prompt, as cart-sim computes them: equal hashes mean equal
// prefixes.
func BlockHashes(rendered []byte, blockTokens int) []uint64 {
	if blockTokens <= 0 {
		return nil
	}
	n := PromptTokens(rendered) / blockTokens
	if n == 0 {
		return nil
	}
	blockBytes := blockTokens * BytesPerToken
	out := make([]uint64, n)
	h := fnv.New64a()
	var prev [8]byte
	for i := range n {
		end := min((i+1)*blockBytes, len(rendered))
		h.Reset()
		_, _ = h.Write(prev[:])
		_, _ = h.Write(rendered[i*blockBytes : end])
		out[i] = h.Sum64()
		binary.LittleEndian.PutUint64(prev[:], out[i])
	}
	return out
}

// Oracle is one LRU prefix cache with the capacity of the whole pool: the
// hit ratio it reaches when requests are replayed through it in order is the
// ceiling any router can reach on that pool.
type Oracle struct {
	blockTokens int
	capacity    int // blocks; 0 = unbounded
	blocks      map[uint64]*list.Element
	lru         list.List // front = most recently used

	promptTokens int64
	cachedTokens int64
}

// NewOracle returns an empty oracle cache of capacityTokens (0 = unbounded)
// in blocks of blockTokens.
func NewOracle(capacityTokens, blockTokens int) *Oracle {
	if blockTokens <= 0 {
		blockTokens = 16
	}
	return &Oracle{
		blockTokens: blockTokens,
		capacity:    capacityTokens / blockTokens,
		blocks:      make(map[uint64]*list.Element),
	}
}

// Access replays one request: it returns the cached prefix length in tokens
// (longest run of leading cached blocks, capped at promptTokens), then
// inserts all the request's blocks, evicting least recently used ones.
func (o *Oracle) Access(hashes []uint64, promptTokens int) int {
	n := 0
	for n < len(hashes) {
		if _, ok := o.blocks[hashes[n]]; !ok {
			break
		}
		n++
	}
	// Insert tail first so block 0 ends most recently used: under pressure
	// a prompt loses its suffix before its prefix, as in cart-sim and vLLM.
	for i := len(hashes) - 1; i >= 0; i-- {
		if e, ok := o.blocks[hashes[i]]; ok {
			o.lru.MoveToFront(e)
		} else {
			o.blocks[hashes[i]] = o.lru.PushFront(hashes[i])
		}
		for o.capacity > 0 && o.lru.Len() > o.capacity {
			old := o.lru.Back()
			o.lru.Remove(old)
			delete(o.blocks, old.Value.(uint64))
		}
	}
	cached := min(n*o.blockTokens, promptTokens)
	o.promptTokens += int64(promptTokens)
	o.cachedTokens += int64(cached)
	return cached
}

// AccessMessages renders msgs and replays them; it returns the prompt and
// cached token counts.
func (o *Oracle) AccessMessages(msgs []Message) (prompt, cached int) {
	r := RenderChat(msgs)
	prompt = PromptTokens(r)
	return prompt, o.Access(BlockHashes(r, o.blockTokens), prompt)
}

// HitRatio is Σcached/Σprompt tokens over every access so far.
func (o *Oracle) HitRatio() float64 {
	if o.promptTokens == 0 {
		return 0
	}
	return float64(o.cachedTokens) / float64(o.promptTokens)
}

// Len is the number of cached blocks.
func (o *Oracle) Len() int { return o.lru.Len() }
