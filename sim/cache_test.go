package sim

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
)

func TestPrefixCacheMatchStopsAtFirstMiss(t *testing.T) {
	c := newPrefixCache(0)
	c.insert([]uint64{1, 2, 3}, nil)
	if got := c.match([]uint64{1, 2, 9, 3}); got != 2 {
		t.Fatalf("match = %d, want 2", got)
	}
	if got := c.match([]uint64{9, 1, 2}); got != 0 {
		t.Fatalf("match with a missing first block = %d, want 0", got)
	}
	if got := c.len(); got != 3 {
		t.Fatalf("len = %d, want 3", got)
	}
}

func TestPrefixCacheEvictsLeastRecentlyUsed(t *testing.T) {
	c := newPrefixCache(4)
	c.insert([]uint64{1, 2}, nil)
	c.insert([]uint64{3, 4}, nil)
	c.match([]uint64{1, 2}) // refresh the older prompt
	c.insert([]uint64{5, 6}, nil)
	if got := c.match([]uint64{3, 4}); got != 0 {
		t.Errorf("least recently used prompt still matches %d blocks", got)
	}
	if got := c.match([]uint64{1, 2}); got != 2 {
		t.Errorf("refreshed prompt matches %d blocks, want 2", got)
	}
	if got := c.match([]uint64{5, 6}); got != 2 {
		t.Errorf("newest prompt matches %d blocks, want 2", got)
	}
	if got := c.len(); got != 4 {
		t.Errorf("len = %d, want capacity 4", got)
	}
}

func TestPrefixCacheEvictsSuffixBeforePrefix(t *testing.T) {
	// A prompt longer than the cache keeps its leading blocks, which are the
	// only ones a later request could match.
	c := newPrefixCache(3)
	c.insert([]uint64{1, 2, 3, 4, 5}, nil)
	if got := c.match([]uint64{1, 2, 3, 4, 5}); got != 3 {
		t.Fatalf("match = %d, want the 3 leading blocks", got)
	}
	// Under pressure from another prompt, the first prompt loses its tail
	// first.
	c.insert([]uint64{7}, nil)
	if got := c.match([]uint64{1, 2, 3}); got != 2 {
		t.Fatalf("after one eviction match = %d, want 2", got)
	}
}

func TestBlockHashesAreChained(t *testing.T) {
	a := []byte(strings.Repeat("a", 64) + strings.Repeat("b", 64) + "tail")
	b := []byte(strings.Repeat("x", 64) + strings.Repeat("b", 64) + "tail")
	ha, hb := blockHashes(a, 16, "", ""), blockHashes(b, 16, "", "")
	if len(ha) != 2 || len(hb) != 2 {
		t.Fatalf("got %d and %d full blocks, want 2", len(ha), len(hb))
	}
	if ha[1] == hb[1] {
		t.Fatal("identical second blocks after different first blocks hash equal; hashes are not chained")
	}
	if again := blockHashes(a[:130], 16, "", ""); again[0] != ha[0] || again[1] != ha[1] {
		t.Fatal("hashes of a shared prefix differ")
	}
	if got := blockHashes([]byte(strings.Repeat("z", 63)), 16, "", ""); len(got) != 1 {
		t.Fatalf("63 bytes = 16 tokens should be one full block, got %d", len(got))
	}
	if got := blockHashes([]byte("short"), 16, "", ""); got != nil {
		t.Fatalf("a prompt shorter than a block has %d blocks", len(got))
	}
}

func TestIdenticalPromptHitsCache(t *testing.T) {
	_, ts := startReplica(t, Config{})
	body := chatBody(strings.Repeat("The quick brown fox jumps over the lazy dog. ", 20))

	first := complete(t, ts, pathChat, body)
	if first.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("first request cached %d tokens, want 0", first.Usage.PromptTokensDetails.CachedTokens)
	}
	second := complete(t, ts, pathChat, body)
	p := second.Usage.PromptTokens
	if want := p / 16 * 16; second.Usage.PromptTokensDetails.CachedTokens != want {
		t.Fatalf("repeat cached %d of %d tokens, want every full block (%d)", second.Usage.PromptTokensDetails.CachedTokens, p, want)
	}
	if first.Choices[0].Message.Content != second.Choices[0].Message.Content {
		t.Error("the same prompt produced different text")
	}
}

func TestPartialPrefixCountsOnlySharedFullBlocks(t *testing.T) {
	_, ts := startReplica(t, Config{})
	cached(t, ts, seq(0, 64)) // 4 blocks of 16 tokens

	// Shares tokens 0..39: blocks 0 and 1 fully, block 2 only in part.
	diverging := append(seq(0, 40), seq(1000, 24)...)
	if got := cached(t, ts, diverging); got != 32 {
		t.Fatalf("cached = %d, want 32 (two shared full blocks)", got)
	}
	// A prompt that is a strict prefix ending mid-block.
	if got := cached(t, ts, seq(0, 50)); got != 48 {
		t.Fatalf("prefix of 50 tokens cached %d, want 48", got)
	}
	// Nothing shared at the first token means nothing cached at all, even
	// though later tokens match.
	if got := cached(t, ts, append([]int{999}, seq(1, 63)...)); got != 0 {
		t.Fatalf("different first token cached %d, want 0", got)
	}
}

func TestMultiTurnConversationReusesPrefix(t *testing.T) {
	_, ts := startReplica(t, Config{})
	turn1 := []map[string]any{
		{"role": "system", "content": strings.Repeat("You are a helpful assistant. ", 10)},
		{"role": "user", "content": "What is a prefix cache?"},
	}
	first := complete(t, ts, pathChat, map[string]any{"messages": turn1})
	turn2 := append(turn1,
		map[string]any{"role": "assistant", "content": first.Choices[0].Message.Content},
		map[string]any{"role": "user", "content": "And why does routing matter?"},
	)
	second := complete(t, ts, pathChat, map[string]any{"messages": turn2})
	got := second.Usage.PromptTokensDetails.CachedTokens
	// Everything up to the last full block of turn 1 before its generation
	// prompt is shared.
	if got == 0 || got >= second.Usage.PromptTokens || got < first.Usage.PromptTokens-2*16 {
		t.Fatalf("second turn cached %d of %d tokens; first turn had %d", got, second.Usage.PromptTokens, first.Usage.PromptTokens)
	}
}

func TestLRUEvictsOldestPromptOverCapacity(t *testing.T) {
	s, ts := startReplica(t, Config{CacheTokens: 8 * 16})
	a, b, c := seq(0, 64), seq(1000, 64), seq(2000, 64) // 4 blocks each

	cached(t, ts, a)
	cached(t, ts, b)
	if got := s.Stats().CacheBlocks; got != 8 {
		t.Fatalf("cache holds %d blocks, want 8", got)
	}
	cached(t, ts, c) // evicts a, the least recently used
	if got := s.Stats().CacheBlocks; got != 8 {
		t.Fatalf("cache holds %d blocks after eviction, want capacity 8", got)
	}
	if got := cached(t, ts, b); got != 64 {
		t.Fatalf("b cached %d, want 64: it was newer than a", got)
	}
	// b was just refreshed, so re-inserting a now evicts c rather than b.
	if got := cached(t, ts, a); got != 0 {
		t.Fatalf("a cached %d, want 0: it should have been evicted", got)
	}
	if got := cached(t, ts, c); got != 0 {
		t.Fatalf("c cached %d, want 0: it was the least recently used", got)
	}
}

func TestBlocksAreInsertedOnlyAfterPrefill(t *testing.T) {
	s := New(Config{MaxConcurrency: 2})
	// A pauses right after its lookup until B has done its own lookup, so B
	// is guaranteed to be looked up while A is still prefilling.
	aStarted, bLooked := make(chan struct{}), make(chan struct{})
	s.hooks.prefillStart = func(j *job) {
		switch j.requestID {
		case "A":
			close(aStarted)
			<-bLooked
		case "B":
			close(bLooked)
		}
	}
	ts := startServer(t, s)

	prompt := chatBody(strings.Repeat("shared context ", 40))
	var wg sync.WaitGroup
	var a chatResult
	wg.Go(func() {
		var err error
		if a, err = tryComplete(ts, pathChat, prompt, "X-Request-Id", "A"); err != nil {
			t.Error(err)
		}
	})
	<-aStarted
	b := complete(t, ts, pathChat, prompt, "X-Request-Id", "B")
	wg.Wait()

	if got := b.Usage.PromptTokensDetails.CachedTokens; got != 0 {
		t.Fatalf("B, looked up while A was prefilling, cached %d tokens, want 0", got)
	}
	if got := a.Usage.PromptTokensDetails.CachedTokens; got != 0 {
		t.Fatalf("A cached %d tokens, want 0", got)
	}
	c := complete(t, ts, pathChat, prompt, "X-Request-Id", "C")
	if got, p := c.Usage.PromptTokensDetails.CachedTokens, c.Usage.PromptTokens; got != p/16*16 {
		t.Fatalf("C, after both prefills, cached %d of %d tokens", got, p)
	}
}

func TestQueuedRequestReusesPredecessorsBlocks(t *testing.T) {
	// With a serial queue, an identical request waiting behind another is
	// looked up when it is admitted, after the first one's blocks exist:
	// what a real scheduler does, and why queued duplicates are cheap.
	s := New(Config{MaxConcurrency: 1})
	release := make(chan struct{})
	s.hooks.prefillStart = func(j *job) {
		if j.requestID == "A" {
			<-release
		}
	}
	ts := startServer(t, s)

	prompt := chatBody(strings.Repeat("queued context ", 40))
	var wg sync.WaitGroup
	wg.Go(func() {
		if _, err := tryComplete(ts, pathChat, prompt, "X-Request-Id", "A"); err != nil {
			t.Error(err)
		}
	})
	testkit.WaitFor(t, 10*time.Second, "A to be admitted", func() bool { return s.Stats().Running == 1 })
	var b chatResult
	wg.Go(func() {
		var err error
		if b, err = tryComplete(ts, pathChat, prompt, "X-Request-Id", "B"); err != nil {
			t.Error(err)
		}
	})
	testkit.WaitFor(t, 10*time.Second, "B to queue", func() bool { return s.Stats().Queued == 1 })
	close(release)
	wg.Wait()

	if got, p := b.Usage.PromptTokensDetails.CachedTokens, b.Usage.PromptTokens; got != p/16*16 {
		t.Fatalf("queued duplicate cached %d of %d tokens, want all full blocks", got, p)
	}
}

func TestCacheCapacityMustHoldABlock(t *testing.T) {
	if err := (Config{CacheTokens: 8, BlockTokens: 16}).Validate(); err == nil {
		t.Fatal("a cache smaller than one block was accepted")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("New accepted an invalid config")
		}
	}()
	New(Config{CacheTokens: -1})
}
