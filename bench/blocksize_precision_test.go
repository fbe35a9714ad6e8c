package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// The shared traces share text in whole 2048-character blocks, a multiple
// of every block size studied, so BenchmarkBlockSize cannot see what a
// larger block costs: the up to block-1 characters of a shared prefix that
// end inside a block, and the prompts shorter than one block, which match
// nothing. BenchmarkBlockSizePrecision replays, the same way, three
// workloads whose shared prefixes end at arbitrary characters:
//
//   - cut-<trace>: the three shared traces with every trace block's text
//     given a length drawn from its id and the seed, uniform in
//     1024..3071 characters (the mean stays 2048), and the last,
//     partial block of a request cut in the same proportion as the
//     trace cuts it. Which requests share what is the trace's; where
//     each shared prefix ends is arbitrary.
//   - short: chat prompts (system + user, rendered as cart-sim's
//     template does) with one of 1000 system prompts, Zipf(1.1)
//     popularity, of log-uniform length 8..1024 characters, and a
//     unique user turn of log-uniform length 50..400 characters; a
//     third of the prompts are shorter than 256 characters. Poisson, 50
//     requests/s, each replica's cache 8k tokens.
//   - multiturn: 1200 conversations over 600 s, each 2..12 turns; a turn
//     appends the previous answer (4 characters per output token, never
//     cached by the replica, as in the traces) and a 50..400-character
//     user message to the history, so each prompt extends the previous
//     one by an arbitrary length; one of 40 system prompts (Zipf(1.1),
//     16..4096 characters); each replica's cache 16k tokens.
//
// Each workload runs with several seeds (sub-benchmark seed=N), and the
// short and multi-turn ones also at 64 and 128 with the engine's
// tie-breaks drawn from other seeds (tiebreak=N): the spread that causes
// is the noise a difference between block sizes must beat. block=blind
// routes without hashes (least-loaded), the floor. The replicas' prefix caches are LRU in 16-token blocks (vLLM's
// block size), or per token (cache=1tok, SGLang's radix cache), where a
// prefix shorter than 16 tokens can hit too.
//
//	go test -run XXX -bench BlockSizePrecision -benchtime 1x ./bench/
func BenchmarkBlockSizePrecision(b *testing.B) {
	dir := filepath.Join("..", "..", "shared", "traces")
	type named struct {
		name string
		make func(seed uint64) simWorkload
	}
	var wls []named
	for _, tr := range []struct {
		name  string
		limit int
		seeds int
	}{
		{"mooncake_conversation", 4000, 2},
		{"sglang_gsp_default_blk512", 0, 3},
		{"llmd_shared_prefix_73pct_blk512", 0, 3},
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
		for seed := range uint64(tr.seeds) {
			wls = append(wls, named{fmt.Sprintf("cut-%s/seed=%d", tr.name, seed+1), func(uint64) simWorkload {
				return traceWorkload(recs, newCutBlockTexts(seed+1))
			}})
		}
	}
	for _, cache := range []int{16, 1} {
		for seed := range uint64(3) {
			wls = append(wls,
				named{fmt.Sprintf("short/cache=%dtok/seed=%d", cache, seed+1), func(s uint64) simWorkload { return shortWorkload(s, cache) }},
				named{fmt.Sprintf("multiturn/cache=%dtok/seed=%d", cache, seed+1), func(s uint64) simWorkload { return multiTurnWorkload(s, cache) }})
		}
	}
	for _, wl := range wls {
		var seed uint64
		if i := strings.LastIndex(wl.name, "seed="); i >= 0 {
			_, _ = fmt.Sscanf(wl.name[i:], "seed=%d", &seed)
		}
		w := wl.make(seed)
		type variant struct {
			bc       int
			tieBreak uint64
		}
		vs := []variant{{64, 1}, {128, 1}, {256, 1}, {blind, 1}}
		if !strings.HasPrefix(wl.name, "cut-") {
			// The noise: the same block size with other tie-breaks.
			vs = append(vs, variant{64, 2}, variant{64, 3}, variant{128, 2}, variant{128, 3})
		}
		for _, v := range vs {
			label := fmt.Sprint(v.bc)
			if v.bc == blind {
				label = "blind"
			}
			if v.tieBreak != 1 {
				label += fmt.Sprintf("/tiebreak=%d", v.tieBreak)
			}
			b.Run(fmt.Sprintf("%s/block=%s", wl.name, label), func(b *testing.B) {
				var r replayResult
				for b.Loop() {
					r = replayTieBreak(w, v.bc, v.tieBreak)
				}
				b.ReportMetric(r.hit(), "hit")
				b.ReportMetric(r.oracle, "oracle-hit")
				b.ReportMetric(r.hashCPU.Seconds()*1e6/float64(r.n), "hash-µs")
				b.ReportMetric(r.decideCPU.Seconds()*1e6/float64(r.n), "decide-µs")
				b.ReportMetric(float64(r.blocks)/float64(r.n), "blocks")
				b.ReportMetric(float64(r.cacheHits)/float64(r.n), "cache_hit-share")
				b.ReportMetric(float64(r.oneBlock)/float64(r.n), "oneblock-share")
				b.ReportMetric(float64(r.short)/float64(r.n), "short-share")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

// newCutBlockTexts gives every trace block a text of its own length,
// drawn from its id and seed, so that shared prefixes end at arbitrary
// characters; a request's last block is cut in the proportion the trace
// cuts it.
func newCutBlockTexts(seed uint64) blockTexts {
	t := blockTexts{m: map[int64]string{}, gen: func(id int64) string {
		n := TraceBlockChars/2 + int(mix64(uint64(id)^mix64(seed))%TraceBlockChars)
		return seededText(uint64(id), 0x5ca1ab1e0ddba11, n)
	}}
	t.prompt = func(ids []int64, inputTokens int) string { return cutPrompt(ids, inputTokens, t.text) }
	return t
}

func cutPrompt(ids []int64, inputTokens int, text func(int64) string) string {
	want := inputTokens * BytesPerToken
	var b strings.Builder
	for i, id := range ids {
		before := i * TraceBlockChars // what the trace's own prompt holds before this block
		if before >= want {
			break
		}
		t := text(id)
		if rest := want - before; rest < TraceBlockChars {
			t = t[:len(t)*rest/TraceBlockChars]
		}
		b.WriteString(t)
	}
	return b.String()
}

// logUniform draws from [lo, hi] with a uniform logarithm: as many system
// prompts of 8-64 characters as of 256-2048.
func logUniform(r *rand.Rand, lo, hi int) int {
	return int(math.Exp(math.Log(float64(lo)) + r.Float64()*(math.Log(float64(hi))-math.Log(float64(lo)))))
}

func uniform(r *rand.Rand, lo, hi int) int { return lo + r.IntN(hi-lo+1) }

// systemPrompts returns n system prompts of log-uniform length in [lo, hi]
// and a Zipf(1.1) draw over them.
func systemPrompts(r *rand.Rand, ns uint64, n, lo, hi int) ([]string, *rand.Zipf) {
	out := make([]string, n)
	for i := range out {
		out[i] = seededText(uint64(i), ns, logUniform(r, lo, hi))
	}
	return out, rand.NewZipf(r, 1.1, 1, uint64(n-1))
}

func shortWorkload(seed uint64, cacheBlockTokens int) simWorkload {
	r := rand.New(rand.NewPCG(seed, 0x5407))
	sys, pick := systemPrompts(r, 0x5157e3^seed, 1000, 8, 1024)
	const n, ratePerS = 20_000, 50
	reqs := make([]simRequest, n)
	at := 0.0
	for i := range reqs {
		at += r.ExpFloat64() * 1000 / ratePerS
		msgs := []Message{{Role: "system", Content: sys[pick.Uint64()]},
			{Role: "user", Content: seededText(uint64(i), 0x75e7^seed, logUniform(r, 50, 400))}}
		reqs[i] = simRequest{at: int64(at), text: string(RenderChat(msgs)), out: uniform(r, 16, 256)}
	}
	// Sized so that the system prompts do not all fit everywhere: where a
	// prompt goes matters.
	return simWorkload{n: n, req: func(i int) simRequest { return reqs[i] }, capTokens: 8_000 / cacheBlockTokens * cacheBlockTokens, cacheBlockTokens: cacheBlockTokens}
}

func multiTurnWorkload(seed uint64, cacheBlockTokens int) simWorkload {
	r := rand.New(rand.NewPCG(seed, 0x7042))
	sys, pick := systemPrompts(r, 0x3717^seed, 40, 16, 4096)
	const convs, spanMs = 1200, 600_000
	var reqs []simRequest
	for c := range convs {
		msgs := []Message{{Role: "system", Content: sys[pick.Uint64()]}}
		at := int64(r.IntN(spanMs))
		for turn := range uniform(r, 2, 12) {
			msgs = append(msgs, Message{Role: "user", Content: seededText(uint64(c)<<8|uint64(turn), 0x75e7^seed, uniform(r, 50, 400))})
			out := uniform(r, 16, 256)
			reqs = append(reqs, simRequest{at: at, text: string(RenderChat(msgs)), out: out})
			msgs = append(msgs, Message{Role: "assistant", Content: seededText(uint64(c)<<8|uint64(turn), 0xa5^seed, out*BytesPerToken)})
			// The next turn comes after the answer and a think time.
			at += 20 + 5*int64(out) + int64(uniform(r, 2_000, 30_000))
		}
	}
	sort.SliceStable(reqs, func(i, j int) bool { return reqs[i].at < reqs[j].at })
	return simWorkload{n: len(reqs), req: func(i int) simRequest { return reqs[i] }, capTokens: 16_000 / cacheBlockTokens * cacheBlockTokens, cacheBlockTokens: cacheBlockTokens}
}
