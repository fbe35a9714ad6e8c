package bench

import (
	"slices"
	"strings"
	"testing"
	"time"
)

const sampleTrace = `{"timestamp": 0, "input_length": 700, "output_length": 500, "hash_ids": [0, 1]}

{"timestamp": 30, "input_length": 1100, "output_length": 3, "hash_ids": [0, 1, 2], "group": 4, "prompt": 2}
{"timestamp": 10, "input_length": 100, "output_length": 90, "hash_ids": [7]}
`

func TestParseTraceFields(t *testing.T) {
	recs, err := ParseTrace(strings.NewReader(sampleTrace))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 {
		t.Fatalf("got %d records, want 3 (blank line skipped)", len(recs))
	}
	r := recs[1]
	if r.Timestamp != 30 || r.InputLength != 1100 || r.OutputLength != 3 || !slices.Equal(r.HashIDs, []int64{0, 1, 2}) {
		t.Errorf("record 1 = %+v", r)
	}
	if r.Group == nil || *r.Group != 4 || r.Prompt == nil || *r.Prompt != 2 {
		t.Errorf("group/prompt not parsed: %+v", r)
	}
	if recs[0].Group != nil {
		t.Errorf("group should be absent on record 0")
	}
}

func TestParseTraceErrors(t *testing.T) {
	for name, in := range map[string]string{
		"bad json": "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n{oops\n",
		"negative": `{"timestamp": 0, "input_length": -1, "output_length": 1, "hash_ids": [1]}`,
		"empty":    "\n\n",
	} {
		_, err := ParseTrace(strings.NewReader(in))
		if err == nil {
			t.Errorf("%s: no error", name)
		}
		if name == "bad json" && !strings.Contains(err.Error(), "line 2") {
			t.Errorf("%s: error %q does not name line 2", name, err)
		}
	}
}

func TestSliceTraceRebases(t *testing.T) {
	recs, _ := ParseTrace(strings.NewReader(sampleTrace))
	s := SliceTrace(recs, 1, 5)
	if len(s) != 2 {
		t.Fatalf("len = %d, want 2", len(s))
	}
	if s[0].Timestamp != 20 || s[1].Timestamp != 0 {
		t.Errorf("timestamps not rebased to the slice minimum: %d %d", s[0].Timestamp, s[1].Timestamp)
	}
	if recs[1].Timestamp != 30 {
		t.Errorf("SliceTrace modified its input")
	}
	if SliceTrace(recs, 3, 1) != nil {
		t.Errorf("start past the end should give nil")
	}
	if len(SliceTrace(recs, 0, 0)) != 3 {
		t.Errorf("limit 0 should take everything")
	}
}

func TestTraceWorkloadTimingAndCap(t *testing.T) {
	recs, _ := ParseTrace(strings.NewReader(sampleTrace))
	w := TraceWorkload("t", recs, TraceOptions{Speedup: 2, MaxTokensCap: 64})
	if len(w.Requests) != 3 {
		t.Fatal(len(w.Requests))
	}
	// Sorted by arrival: 0, 10, 30 ms of trace time, halved.
	wantAt := []time.Duration{0, 5 * time.Millisecond, 15 * time.Millisecond}
	wantMax := []int{64, 64, 3}
	for i, r := range w.Requests {
		if r.At != wantAt[i] || r.MaxTokens != wantMax[i] || r.ID != i {
			t.Errorf("request %d: at %v max %d id %d, want at %v max %d", i, r.At, r.MaxTokens, r.ID, wantAt[i], wantMax[i])
		}
	}
	p := TraceWorkload("t", recs, TraceOptions{Rate: 100, Seed: 3})
	q := TraceWorkload("t", recs, TraceOptions{Rate: 100, Seed: 3})
	if p.Requests[0].At != 0 || p.Requests[2].At <= p.Requests[1].At || p.Requests[2].At != q.Requests[2].At {
		t.Errorf("Poisson arrivals should start at 0, increase and be repeatable")
	}
}

func TestBlockTextDeterministic(t *testing.T) {
	// Same id gives the same text whatever was generated before.
	a1 := BlockText(42)
	_ = BlockText(7)
	b1 := BlockText(43)
	b2 := BlockText(43)
	a2 := BlockText(42)
	if a1 != a2 || b1 != b2 {
		t.Fatal("BlockText depends on call order")
	}
	if a1 == b1 {
		t.Fatal("different ids gave the same text")
	}
	if len(a1) != TraceBlockChars {
		t.Fatalf("block text is %d chars, want %d", len(a1), TraceBlockChars)
	}
	seen := map[string]int64{}
	for id := int64(0); id < 200; id++ {
		txt := BlockText(id)
		if prev, ok := seen[txt]; ok {
			t.Fatalf("ids %d and %d share text", prev, id)
		}
		seen[txt] = id
	}
	if BlockText(-5) == BlockText(5) {
		t.Error("negative ids collide")
	}
}

func TestTracePromptTruncation(t *testing.T) {
	p := TracePrompt([]int64{3, 9, 11}, 1100)
	if len(p) != 1100*BytesPerToken {
		t.Fatalf("len = %d, want %d", len(p), 1100*BytesPerToken)
	}
	if p[:TraceBlockChars] != BlockText(3) || p[TraceBlockChars:2*TraceBlockChars] != BlockText(9) {
		t.Error("blocks not concatenated in order")
	}
	if p[2*TraceBlockChars:] != BlockText(11)[:1100*4-2*TraceBlockChars] {
		t.Error("last block not truncated from its start")
	}
	// Requests sharing leading ids share that prefix, and no more.
	q := TracePrompt([]int64{3, 9, 12}, 1536)
	if q[:2*TraceBlockChars] != p[:2*TraceBlockChars] || q[2*TraceBlockChars:2*TraceBlockChars+64] == p[2*TraceBlockChars:2*TraceBlockChars+64] {
		t.Error("shared-prefix structure not preserved")
	}
	// Fewer ids than the input length covers: the whole concatenation.
	if got := TracePrompt([]int64{1}, 4000); got != BlockText(1) {
		t.Errorf("short ids: len %d", len(got))
	}
	if TracePrompt([]int64{1, 2}, 0) != "" {
		t.Error("zero input length should be empty")
	}
}

func TestSyntheticWorkloads(t *testing.T) {
	g := GSPConfig{Groups: 3, PromptsPerGroup: 4, SystemTokens: 64, QuestionTokens: 8, OutputTokens: 100, Seed: 1}
	w, err := GSPWorkload(g, 16)
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Requests) != 12 {
		t.Fatalf("%d requests", len(w.Requests))
	}
	systems := map[string]int{}
	for _, r := range w.Requests {
		if r.MaxTokens != 16 || len(r.Messages) != 2 || len(r.Messages[0].Content) != 64*4 || len(r.Messages[1].Content) != 8*4 {
			t.Fatalf("bad request %+v", r)
		}
		systems[r.Messages[0].Content]++
	}
	if len(systems) != 3 {
		t.Errorf("%d distinct system prompts, want 3", len(systems))
	}
	for _, n := range systems {
		if n != 4 {
			t.Errorf("group size %d, want 4", n)
		}
	}
	m, err := MultiTurnWorkload(MultiTurnConfig{Chats: 2, Turns: 3, SystemTokens: 10, QuestionTokens: 5, OutputTokens: 4}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if m.Total() != 6 || len(m.Chats[1].Questions) != 3 {
		t.Errorf("multiturn total %d", m.Total())
	}
}
