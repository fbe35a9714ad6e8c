package decider

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
)

// BenchmarkDecide is one in-process decision and its settlement through
// the decider (lock, clock, ticket, lock-hold observation), over a pool of
// 8 workers and prompts sharing a system prompt: the all-in-one hot path.
// Compare with engine's BenchmarkEngineRoute for the decider's own overhead.
func BenchmarkDecide(b *testing.B) {
	d := New(Options{
		Policy:      engine.Policy{Threshold: 0.5, BalanceAbsThreshold: 4, BalanceRelThreshold: 1.5, BlockChars: 64},
		MaxEntries:  1 << 16,
		InlineEvict: true,
		Rand:        rand.New(rand.NewPCG(1, 2)),
	})
	var ws []engine.WorkerSpec
	for i := range 8 {
		ws = append(ws, engine.WorkerSpec{URL: fmt.Sprintf("http://w%d", i)})
	}
	d.SetWorkers(ws)
	system := make([]byte, 2048)
	for i := range system {
		system[i] = byte('a' + i%26)
	}
	const prompts = 1000
	reqs := make([]Request, prompts)
	for i := range reqs {
		text := append(append([]byte(nil), system...), fmt.Sprintf("user question %d: %0512d", i, i)...)
		reqs[i] = Request{Request: engine.Request{Hashes: index.Hash(nil, "m", text, 64), KeyLen: len(text)}}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		dec, err := d.Decide(reqs[i%prompts])
		if err != nil {
			b.Fatal(err)
		}
		if err := d.Settle(dec.Ticket, Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1}); err != nil {
			b.Fatal(err)
		}
	}
}
