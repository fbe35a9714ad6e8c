package sim

// fillerWords is the vocabulary of generated output; each word stands for one
// output token. Short common words keep the byte size of a response close to
// what a real model's tokens would produce.
var fillerWords = [...]string{
	"the", "cache", "router", "replica", "prefix", "token", "block", "model",
	"request", "of", "and", "to", "in", "is", "that", "for",
	"with", "as", "on", "by", "this", "be", "are", "from",
	"at", "an", "it", "which", "we", "can", "each", "more",
	"latency", "queue", "batch", "decode", "prefill", "hit", "miss", "route",
	"fast", "warm", "cold", "load", "share", "reuse", "state", "time",
	"data", "path", "node", "key", "value", "memory", "work", "flow",
	"so", "not", "all", "one", "two", "new", "same", "next",
}

// fillerText deterministically produces the words of a response. The same
// seed always yields the same sequence, so a replayed request gets the same
// answer, like greedy decoding would give.
type fillerText struct {
	state uint64
	n     int
}

func newFillerText(seed uint64) *fillerText { return &fillerText{state: seed} }

// next returns the next token's text; every token after the first carries its
// leading space, as BPE tokens do, so streamed deltas concatenate into the
// non-streamed text.
func (f *fillerText) next() string {
	// splitmix64: tiny, stateless beyond one word, and well distributed even
	// for adjacent seeds.
	f.state += 0x9e3779b97f4a7c15
	z := f.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	w := fillerWords[z%uint64(len(fillerWords))]
	f.n++
	if f.n == 1 {
		return w
	}
	return " " + w
}
