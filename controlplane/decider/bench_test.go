package decider

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/flow"
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

// BenchmarkPumpNothingPlaceable is one dispatch pass (pump) that places
// nothing: 64 split requests wait for a full prefill side while a decode
// worker frees a slot, the pass each finished decode leg runs under the
// lock in a split pool with flow control on.
func BenchmarkPumpNothingPlaceable(b *testing.B) {
	d := New(Options{Policy: engine.Policy{Threshold: 0.3, BalanceAbsThreshold: 64, BalanceRelThreshold: 1.5, BlockChars: 64}, MaxEntries: 1 << 16})
	var ws []engine.WorkerSpec
	for i := range 8 {
		ws = append(ws, engine.WorkerSpec{URL: fmt.Sprintf("http://p%d", i), Role: engine.RolePrefill, MaxConcurrency: 1},
			engine.WorkerSpec{URL: fmt.Sprintf("http://d%d", i), Role: engine.RoleDecode, MaxConcurrency: 64})
	}
	d.SetWorkers(ws)
	text := func(i int) []byte { return fmt.Appendf(nil, "%02048d", i) }
	for i := range 8 { // the prefill side full
		r := Request{Request: engine.Request{Hashes: index.Hash(nil, "m", text(i), 64), KeyLen: 2048, Disagg: engine.DisaggPair}}
		if _, err := d.Decide(r); err != nil {
			b.Fatal(err)
		}
	}
	for i := range 64 {
		r := Request{Request: engine.Request{Hashes: index.Hash(nil, "m", text(100+i), 64), KeyLen: 2048, Disagg: engine.DisaggPair}}
		w := &waiter{ctx: context.Background(), req: r, done: make(chan admitted, 1)}
		w.item = &flow.Item[*waiter]{Tenant: fmt.Sprint("t", i%4), Deadline: 1 << 62, Value: w}
		if err := d.fq.Push(w.item); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		d.mu.Lock()
		d.eng.AdjustLoad("http://d0", 1)
		d.eng.AdjustLoad("http://d0", -1) // a decode leg ends: freed moves
		d.pump()
		d.mu.Unlock()
	}
	b.StopTimer()
	if d.fq.Len() != 64 {
		b.Fatalf("%d still waiting, want 64: the pass placed something", d.fq.Len())
	}
}
