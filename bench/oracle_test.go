package bench

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/cartrouter/cart/sim"
	"github.com/cartrouter/cart/sim/simtest"
)

// promptOf returns a prompt of n 16-token blocks built from letters, so the
// test can reason about exactly which blocks are shared.
func promptOf(blocks ...byte) []byte {
	var b []byte
	for _, c := range blocks {
		b = append(b, strings.Repeat(string(c), 64)...)
	}
	return b
}

func TestOracleHandMadeTrace(t *testing.T) {
	o := NewOracle(0, 16)
	access := func(blocks ...byte) int {
		p := promptOf(blocks...)
		return o.Access(BlockHashes(p, 16), PromptTokens(p))
	}
	if got := access('a', 'b', 'c'); got != 0 {
		t.Fatalf("cold cache hit %d", got)
	}
	if got := access('a', 'b', 'd'); got != 32 {
		t.Fatalf("shared 2 blocks: hit %d, want 32", got)
	}
	// Chained hashes: block 'b' after 'x' is not the 'b' after 'a'.
	if got := access('x', 'b', 'c'); got != 0 {
		t.Fatalf("different first block: hit %d, want 0", got)
	}
	if got := access('a', 'b', 'c', 'e'); got != 48 {
		t.Fatalf("hit %d, want 48", got)
	}
	// 0+32+0+48 cached of 48+48+48+64 prompt tokens.
	if want := 80.0 / 208.0; o.HitRatio() != want {
		t.Errorf("hit ratio %v, want %v", o.HitRatio(), want)
	}
}

func TestOracleLRUEviction(t *testing.T) {
	o := NewOracle(4*16, 16) // 4 blocks
	access := func(blocks ...byte) int {
		p := promptOf(blocks...)
		return o.Access(BlockHashes(p, 16), PromptTokens(p))
	}
	access('a', 'b')       // cache: a ab
	access('c', 'd')       // cache: a ab c cd (full)
	if access('a') != 16 { // touches a
		t.Fatal("a should be cached")
	}
	access('e') // evicts the least recently used: ab (tail before prefix), then...
	if o.Len() != 4 {
		t.Fatalf("len %d, want 4", o.Len())
	}
	if got := access('a', 'b'); got != 16 {
		t.Errorf("a should survive and ab be evicted: hit %d, want 16", got)
	}
	// A prompt larger than the cache keeps its prefix, not its tail.
	o2 := NewOracle(2*16, 16)
	p := promptOf('p', 'q', 'r', 's')
	o2.Access(BlockHashes(p, 16), PromptTokens(p))
	if got := o2.Access(BlockHashes(p, 16), PromptTokens(p)); got != 32 {
		t.Errorf("oversized prompt: hit %d, want its first 2 blocks (32)", got)
	}
}

func TestRenderAndBlocks(t *testing.T) {
	r := RenderChat([]Message{{Role: "system", Content: "S"}, {Role: "user", Content: "hi"}})
	if string(r) != "<|system|>\nS\n<|user|>\nhi\n<|assistant|>\n" {
		t.Fatalf("render %q", r)
	}
	if PromptTokens([]byte("12345")) != 2 || PromptTokens(nil) != 0 {
		t.Error("token count should round up bytes/4")
	}
	for _, c := range []struct{ bytes, blocks int }{{191, 3}, {63, 1}, {60, 0}, {0, 0}, {64, 1}, {129, 2}} {
		if n := len(BlockHashes(make([]byte, c.bytes), 16)); n != c.blocks {
			t.Errorf("%d bytes: %d blocks, want %d (full blocks by rounded-up tokens)", c.bytes, n, c.blocks)
		}
	}
}

// TestOracleMatchesReplica replays requests through an in-process cart-sim
// (one unbounded replica) and checks that the oracle, which models the same
// pool, predicts exactly the prompt and cached tokens the replica reports.
func TestOracleMatchesReplica(t *testing.T) {
	replica := simtest.Start(t, sim.Config{Name: "r1", TimeScale: 0})
	sender := NewOpenAISender(replica.URL, "cart-sim", replica.HTTP.Client())
	o := NewOracle(0, 16)
	w := TraceWorkload("t", []TraceRecord{
		{InputLength: 700, OutputLength: 4, HashIDs: []int64{0, 1}},
		{InputLength: 900, OutputLength: 4, HashIDs: []int64{0, 1}},
		{InputLength: 600, OutputLength: 4, HashIDs: []int64{0, 5}},
		{InputLength: 300, OutputLength: 4, HashIDs: []int64{9}},
	}, TraceOptions{MaxTokensCap: 8})
	for _, r := range w.Requests {
		msgs := r.Prompt()
		wantPrompt, wantCached := o.AccessMessages(msgs)
		res := sender.Send(context.Background(), msgs, r.MaxTokens, false)
		if res.Err != nil || res.Status != http.StatusOK {
			t.Fatalf("request %d: %v (status %d)", r.ID, res.Err, res.Status)
		}
		if res.UsageFrom != "usage" || res.Replica != "r1" || res.CompletionTokens != 4 {
			t.Errorf("request %d: usage from %q, replica %q, completion %d", r.ID, res.UsageFrom, res.Replica, res.CompletionTokens)
		}
		if res.PromptTokens != wantPrompt || res.CachedTokens != wantCached {
			t.Errorf("request %d: replica prompt/cached %d/%d, oracle %d/%d", r.ID, res.PromptTokens, res.CachedTokens, wantPrompt, wantCached)
		}
	}
	if o.HitRatio() == 0 {
		t.Error("the hand-made trace shares prefixes: expected hits")
	}
}
