package bench

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"testing"
	"time"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
	"github.com/cartrouter/cart/internal/testkit"
)

// Block-size study (issue 13, target 3): the index block size
// (cache.block_chars) trades matching precision and how much text the
// index bound covers against the CPU of hashing and deciding. Each shared
// trace is replayed in process through the real engine with the default
// cache.* policy and max_tree_size, at 64, 128 and 256 characters per
// block, over 8 simulated replicas whose prefix caches are LRU in 16-token
// blocks (bench.Oracle, 200k tokens each). A request occupies its replica
// for 20 ms + 0.1 ms per uncached prompt token + 5 ms per output token,
// which is what makes load, and so the balance rule, matter.
//
// Metrics: hit = Σ cached / Σ prompt tokens over the replicas' caches
// (oracle-hit: one LRU cache the size of the pool, the ceiling);
// hash-µs and decide-µs = CPU time of the routing thread per request for
// index.Hash of the key text (data plane) and engine.Choose (control plane,
// under the routing lock); blocks = mean blocks per request; entries =
// index size at the end.
//
// With -benchtime 2x the metrics are those of the second replay (the
// first also fills the memo of block texts).
//
//	go test -run XXX -bench BlockSize -benchtime 2x ./bench/
func BenchmarkBlockSize(b *testing.B) {
	dir := filepath.Join("..", "..", "shared", "traces")
	for _, tr := range []struct {
		name  string
		limit int
	}{
		{"mooncake_conversation", 4000}, // the first ~20 minutes: a full replay is 580 MB of text
		{"sglang_gsp_default_blk512", 0},
		{"llmd_shared_prefix_73pct_blk512", 0},
	} {
		path := filepath.Join(dir, tr.name+".jsonl")
		if _, err := os.Stat(path); err != nil {
			b.Skipf("trace %s: %v", path, err)
		}
		recs, err := LoadTrace(path)
		if err != nil {
			b.Fatal(err)
		}
		recs = SliceTrace(recs, 0, tr.limit)
		sort.SliceStable(recs, func(i, j int) bool { return recs[i].Timestamp < recs[j].Timestamp })
		texts := newBlockTexts()
		for _, bc := range []int{64, 128, 256} {
			b.Run(fmt.Sprintf("%s/block=%d", tr.name, bc), func(b *testing.B) {
				var r replayResult
				for b.Loop() {
					r = replayBlocks(recs, bc, texts)
				}
				b.ReportMetric(r.hit(), "hit")
				b.ReportMetric(r.oracle, "oracle-hit")
				b.ReportMetric(r.hashCPU.Seconds()*1e6/float64(r.n), "hash-µs")
				b.ReportMetric(r.decideCPU.Seconds()*1e6/float64(r.n), "decide-µs")
				b.ReportMetric(float64(r.blocks)/float64(r.n), "blocks")
				b.ReportMetric(float64(r.entries), "entries")
				b.ReportMetric(float64(r.cacheHits)/float64(r.n), "cache_hit-share")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

// blockTexts memoises a trace's block texts: blocks repeat across
// requests.
type blockTexts struct {
	m      map[int64]string
	gen    func(int64) string
	prompt func(ids []int64, inputTokens int) string
}

func newBlockTexts() blockTexts {
	t := blockTexts{m: map[int64]string{}, gen: BlockText}
	t.prompt = func(ids []int64, inputTokens int) string { return tracePrompt(ids, inputTokens, t.text) }
	return t
}

func (t blockTexts) text(id int64) string {
	s, ok := t.m[id]
	if !ok {
		s = t.gen(id)
		t.m[id] = s
	}
	return s
}

type replayResult struct {
	n, blocks, entries, cacheHits int
	// oneBlock: requests whose key is one block, which matches only an
	// identical earlier prompt; short: shorter than 256 characters.
	oneBlock, short    int
	prompt, cached     int64
	oracle             float64
	hashCPU, decideCPU time.Duration
}

func (r replayResult) hit() float64 {
	if r.prompt == 0 {
		return 0
	}
	return float64(r.cached) / float64(r.prompt)
}

type busy struct {
	end    int64 // ms
	worker string
}

type busyHeap []busy

func (h busyHeap) Len() int           { return len(h) }
func (h busyHeap) Less(i, j int) bool { return h[i].end < h[j].end }
func (h busyHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *busyHeap) Push(x any)        { *h = append(*h, x.(busy)) }
func (h *busyHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// simRequest is one request of a replay.
type simRequest struct {
	at   int64  // arrival, ms since the start
	text string // the key text the proxy hashes, and the prompt the replica caches
	out  int    // output tokens
}

// simWorkload is what a replay needs: requests in arrival order, built on
// demand (a trace's prompts do not fit in memory at once), and the
// replicas' prefix caches.
type simWorkload struct {
	n   int
	req func(i int) simRequest
	// capTokens is each replica's cache, in cacheBlockTokens-token blocks.
	capTokens, cacheBlockTokens int
}

func traceWorkload(recs []TraceRecord, texts blockTexts) simWorkload {
	return simWorkload{n: len(recs), capTokens: 200_000, cacheBlockTokens: 16, req: func(i int) simRequest {
		rec := recs[i]
		return simRequest{at: rec.Timestamp, text: texts.prompt(rec.HashIDs, rec.InputLength), out: rec.OutputLength}
	}}
}

func replayBlocks(recs []TraceRecord, blockChars int, texts blockTexts) replayResult {
	return replay(traceWorkload(recs, texts), blockChars)
}

// blind is the block size of a cache-blind replay: no hashes, every
// request routed least-loaded, the floor a block size's loss is measured
// against.
const blind = 0

func replay(w simWorkload, blockChars int) replayResult { return replayTieBreak(w, blockChars, 1) }

// replayTieBreak is replay with the engine's tie-breaks drawn from
// another seed: the spread it causes at one block size is the noise a
// difference between block sizes must beat.
func replayTieBreak(w simWorkload, blockChars int, tieBreak uint64) replayResult {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cfg := config.Default()
	cfg.Cache.BlockChars = max(blockChars, 1)
	pol := decider.PolicyFrom(cfg)
	idx := index.New(index.Options{MaxEntries: cfg.Cache.MaxTreeSize, InlineEvict: true})
	eng := engine.New(pol, idx, rand.New(rand.NewPCG(tieBreak, 2)))
	const replicas = 8
	var specs []engine.WorkerSpec
	caches := map[string]*Oracle{}
	// The ceiling: one LRU cache the size of the whole pool.
	pool := NewOracle(replicas*w.capTokens, w.cacheBlockTokens)
	for i := range replicas {
		u := fmt.Sprintf("http://r%d", i)
		specs = append(specs, engine.WorkerSpec{URL: u})
		caches[u] = NewOracle(w.capTokens, w.cacheBlockTokens)
	}
	eng.SetWorkers(specs)
	var r replayResult
	var pending busyHeap
	var hashes []uint64
	for i := range w.n {
		rq := w.req(i)
		for len(pending) > 0 && pending[0].end <= rq.at {
			eng.Release(heap.Pop(&pending).(busy).worker)
		}
		t0 := testkit.ThreadCPU()
		hashes = hashes[:0]
		if blockChars != blind {
			// The proxy hashes only what a decision can use.
			key := rq.text[:min(len(rq.text), engine.MaxRouteBlocks*blockChars)]
			hashes = index.Hash(hashes, "m", []byte(key), blockChars)
		}
		t1 := testkit.ThreadCPU()
		d, err := eng.Choose(engine.Request{Hashes: hashes, KeyLen: len(rq.text)}, rq.at*int64(time.Millisecond))
		t2 := testkit.ThreadCPU()
		if err != nil {
			panic(err) // no max_load, every replica healthy: cannot happen
		}
		r.hashCPU += t1 - t0
		r.decideCPU += t2 - t1
		r.n++
		r.blocks += len(hashes)
		if len(hashes) == 1 {
			r.oneBlock++
		}
		if d.Reason == engine.ReasonCacheHit {
			r.cacheHits++
		}
		prompt := PromptTokens([]byte(rq.text))
		ch := BlockHashes([]byte(rq.text), w.cacheBlockTokens)
		cached := caches[d.Worker].Access(ch, prompt)
		pool.Access(ch, prompt)
		r.prompt += int64(prompt)
		r.cached += int64(cached)
		if len(rq.text) < 256 {
			r.short++
		}
		dur := 20 + int64(prompt-cached)/10 + 5*int64(rq.out)
		heap.Push(&pending, busy{end: rq.at + dur, worker: d.Worker})
	}
	r.entries = idx.Len()
	r.oracle = pool.HitRatio()
	return r
}
