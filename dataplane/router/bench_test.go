package router

import (
	"context"
	"fmt"
	"testing"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
)

// BenchmarkLocalRouteDone is the all-in-one hot path as the proxy sees it:
// Route then Done, 8 workers, prompts sharing a 2 KiB system prompt.
func BenchmarkLocalRouteDone(b *testing.B) {
	var specs []engine.WorkerSpec
	for i := range 8 {
		specs = append(specs, engine.WorkerSpec{URL: fmt.Sprintf("http://w%d", i)})
	}
	l := NewLocal(LocalOptions{
		Policy:      engine.Policy{Threshold: 0.5, BalanceAbsThreshold: 4, BalanceRelThreshold: 1.5, BlockChars: 64},
		MaxEntries:  1 << 16,
		InlineEvict: true,
		CleanupHour: -1,
		Seed:        1,
	}, specs)
	system := make([]byte, 2048)
	for i := range system {
		system[i] = byte('a' + i%26)
	}
	const prompts = 1000
	reqs := make([]*Request, prompts)
	for i := range reqs {
		text := append(append([]byte(nil), system...), fmt.Sprintf("user question %d: %0512d", i, i)...)
		reqs[i] = &Request{Hashes: index.Hash(nil, "m", text, 64), KeyLen: len(text)}
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		d, err := l.Decide(ctx, reqs[i%prompts])
		if err != nil {
			b.Fatal(err)
		}
		l.Done(d, Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1})
	}
}
