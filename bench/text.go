package bench

import (
	"math/rand/v2"
	"strings"
)

const (
	// BytesPerToken is the tokenisation approximation shared with cart-sim.
	BytesPerToken = 4
	// TraceBlockTokens is the block size of the shipped traces' hash ids.
	TraceBlockTokens = 512
	// TraceBlockChars is the text length of one trace block.
	TraceBlockChars = TraceBlockTokens * BytesPerToken
)

// words is the vocabulary of generated prompt text. Plain ASCII so that one
// character is one byte, which keeps token counts exact under cart-sim's
// 4-bytes-a-token rule.
var words = strings.Fields(`the of and to in is that for it as was with be by on not he this are or
his from at which but have an they you were her she there been one all we their has would when if so
no will can more other its into some could time these two may then do first any my now such like our
over man me even most made after also did many before must through back years where much your way
well down should because each just those people how too little state good very make world still own
see men work long get here between both life being under never day same another know while last might
us great old year off come since against go came right used take three cache router replica prefix
token block prompt model request latency queue batch decode prefill worker pool route index shard
memory server client stream answer question system user assistant context window tensor kernel graph
node leader follower commit snapshot lease metric signal budget retry circuit breaker health probe
river mountain garden window letter market engine harbor forest valley island bridge castle village
orange silver yellow purple violet golden copper marble granite crystal velvet canvas paper pencil`)

// BlockText returns the deterministic text of trace block id: exactly
// TraceBlockChars characters of words drawn from a PRNG seeded with the id
// itself, so a block's text never depends on which request asks for it or
// in which order.
func BlockText(id int64) string {
	return seededText(uint64(id), 0x5ca1ab1e0ddba11, TraceBlockChars)
}

// seededText returns n characters of words drawn from a PRNG seeded with
// (seed, stream).
func seededText(seed, stream uint64, n int) string {
	r := rand.New(rand.NewPCG(seed, stream))
	var b strings.Builder
	b.Grow(n + 16)
	for b.Len() < n {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[r.IntN(len(words))])
	}
	return b.String()[:n]
}

// TracePrompt builds the prompt of a trace request: the concatenation of its
// blocks' texts truncated to inputTokens worth of characters. When the ids
// cover fewer tokens than inputTokens the whole concatenation is returned.
func TracePrompt(hashIDs []int64, inputTokens int) string {
	return tracePrompt(hashIDs, inputTokens, BlockText)
}

// tracePrompt is TracePrompt with block texts from text, so that a replay
// of millions of requests can memoise them.
func tracePrompt(hashIDs []int64, inputTokens int, text func(int64) string) string {
	want := inputTokens * BytesPerToken
	var b strings.Builder
	b.Grow(min(want, len(hashIDs)*TraceBlockChars))
	for _, id := range hashIDs {
		if b.Len() >= want {
			break
		}
		t := text(id)
		if rest := want - b.Len(); len(t) > rest {
			t = t[:rest]
		}
		b.WriteString(t)
	}
	return b.String()
}

// TextTokens returns n tokens (4n characters) of text deterministic in
// (namespace, id), for the synthetic workloads.
func TextTokens(namespace, id uint64, n int) string {
	if n <= 0 {
		return ""
	}
	return seededText(id, 0xb16b00b5^namespace, n*BytesPerToken)
}
