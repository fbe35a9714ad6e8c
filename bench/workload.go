package bench

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"time"
)

// Request is one open-loop request: it is sent At after the run starts,
// whatever happened to the requests before it.
type Request struct {
	ID int
	At time.Duration
	// MaxTokens is the output limit sent as max_tokens.
	MaxTokens int
	// Messages, when set, is the prompt. Otherwise the prompt is built from
	// the trace fields below when the request is sent, so whole traces never
	// sit in memory as text.
	Messages  []Message
	HashIDs   []int64
	InputLen  int
	TraceLine int // index of the record in the trace file (after --start)
}

// Prompt returns the messages to send.
func (r *Request) Prompt() []Message {
	if r.Messages != nil {
		return r.Messages
	}
	return []Message{{Role: "user", Content: TracePrompt(r.HashIDs, r.InputLen)}}
}

// Chat is one closed-loop conversation of the multiturn workload: each turn
// resends the whole history (system prompt, questions and the answers
// received) after the previous answer plus a think time.
type Chat struct {
	ID        int
	Start     time.Duration
	System    string
	Questions []string
	Think     time.Duration
	MaxTokens int
}

// Workload is what a run sends: open-loop requests, closed-loop chats, or
// both.
type Workload struct {
	Name     string
	Requests []Request
	Chats    []Chat
}

// Total is the number of requests the workload sends.
func (w *Workload) Total() int {
	n := len(w.Requests)
	for _, c := range w.Chats {
		n += len(c.Questions)
	}
	return n
}

// TraceOptions turn trace records into requests.
type TraceOptions struct {
	// Speedup divides trace timestamps (2 = twice as fast). <= 0 means 1.
	Speedup float64
	// Rate, when > 0, replaces the timestamps with Poisson arrivals at this
	// many requests per second (seeded, so runs are repeatable); useful for
	// traces whose requests all arrive at t=0.
	Rate float64
	// MaxTokensCap caps each request's max_tokens (<= 0: no cap).
	MaxTokensCap int
	// Seed seeds the Poisson arrivals.
	Seed uint64
}

// MaxTokensFor applies the cap to a trace output length (at least 1).
func MaxTokensFor(outputLen, capTokens int) int {
	n := outputLen
	if capTokens > 0 {
		n = min(n, capTokens)
	}
	return max(n, 1)
}

// TraceWorkload turns trace records into open-loop requests, ordered by
// arrival (stable for equal timestamps).
func TraceWorkload(name string, recs []TraceRecord, o TraceOptions) *Workload {
	speed := o.Speedup
	if speed <= 0 {
		speed = 1
	}
	var arrivals []time.Duration
	if o.Rate > 0 {
		arrivals = PoissonArrivals(len(recs), o.Rate, o.Seed)
	}
	w := &Workload{Name: name, Requests: make([]Request, len(recs))}
	for i, r := range recs {
		at := time.Duration(float64(r.Timestamp) * float64(time.Millisecond) / speed)
		if arrivals != nil {
			at = arrivals[i]
		}
		w.Requests[i] = Request{
			ID: i, At: at, MaxTokens: MaxTokensFor(r.OutputLength, o.MaxTokensCap),
			HashIDs: r.HashIDs, InputLen: r.InputLength, TraceLine: i,
		}
	}
	sort.SliceStable(w.Requests, func(a, b int) bool { return w.Requests[a].At < w.Requests[b].At })
	for i := range w.Requests {
		w.Requests[i].ID = i
	}
	return w
}

// PoissonArrivals returns n arrival offsets of a Poisson process at rate
// per second, starting with 0.
func PoissonArrivals(n int, rate float64, seed uint64) []time.Duration {
	r := rand.New(rand.NewPCG(seed, 0xa771a1))
	out := make([]time.Duration, n)
	var t float64
	for i := range out {
		out[i] = time.Duration(t * float64(time.Second))
		t += r.ExpFloat64() / rate
	}
	return out
}

// GSPConfig is SGLang bench_serving's generated-shared-prefix workload:
// Groups system prompts, each shared by PromptsPerGroup questions.
type GSPConfig struct {
	Groups          int
	PromptsPerGroup int
	SystemTokens    int
	QuestionTokens  int
	OutputTokens    int
	// Rate is the arrival rate in requests/s; 0 sends everything at t=0
	// (SGLang's default of an infinite request rate).
	Rate float64
	Seed uint64
}

// DefaultGSP returns SGLang's defaults (64 groups × 16 prompts, 2048-token
// system prompts, 128-token questions, 256 output tokens).
func DefaultGSP() GSPConfig {
	return GSPConfig{Groups: 64, PromptsPerGroup: 16, SystemTokens: 2048, QuestionTokens: 128, OutputTokens: 256, Seed: 1}
}

// GSPWorkload builds the generated-shared-prefix workload, shuffled
// deterministically as SGLang does.
func GSPWorkload(c GSPConfig, maxTokensCap int) (*Workload, error) {
	if c.Groups < 1 || c.PromptsPerGroup < 1 || c.SystemTokens < 0 || c.QuestionTokens < 1 || c.OutputTokens < 1 {
		return nil, fmt.Errorf("gsp: groups, prompts per group, question and output tokens must be positive")
	}
	n := c.Groups * c.PromptsPerGroup
	w := &Workload{Name: "gsp", Requests: make([]Request, 0, n)}
	for g := range c.Groups {
		sys := TextTokens(1, uint64(g), c.SystemTokens)
		for p := range c.PromptsPerGroup {
			q := TextTokens(2, uint64(g*c.PromptsPerGroup+p), c.QuestionTokens)
			w.Requests = append(w.Requests, Request{
				MaxTokens: MaxTokensFor(c.OutputTokens, maxTokensCap),
				Messages:  []Message{{Role: "system", Content: sys}, {Role: "user", Content: q}},
			})
		}
	}
	r := rand.New(rand.NewPCG(c.Seed, 0x95b))
	r.Shuffle(len(w.Requests), func(i, j int) { w.Requests[i], w.Requests[j] = w.Requests[j], w.Requests[i] })
	var arrivals []time.Duration
	if c.Rate > 0 {
		arrivals = PoissonArrivals(n, c.Rate, c.Seed)
	}
	for i := range w.Requests {
		w.Requests[i].ID = i
		w.Requests[i].TraceLine = -1
		if arrivals != nil {
			w.Requests[i].At = arrivals[i]
		}
	}
	return w, nil
}

// MultiTurnConfig describes Chats conversations of Turns turns each.
type MultiTurnConfig struct {
	Chats          int
	Turns          int
	SystemTokens   int
	QuestionTokens int
	OutputTokens   int
	// Think is the pause between an answer and the next question.
	Think time.Duration
	// ChatRate is the rate at which conversations start, per second; 0
	// starts them all at once.
	ChatRate float64
	Seed     uint64
}

// DefaultMultiTurn is a small multi-turn workload.
func DefaultMultiTurn() MultiTurnConfig {
	return MultiTurnConfig{Chats: 32, Turns: 4, SystemTokens: 512, QuestionTokens: 128, OutputTokens: 64,
		Think: 500 * time.Millisecond, ChatRate: 4, Seed: 1}
}

// MultiTurnWorkload builds the chats.
func MultiTurnWorkload(c MultiTurnConfig, maxTokensCap int) (*Workload, error) {
	if c.Chats < 1 || c.Turns < 1 || c.QuestionTokens < 1 || c.OutputTokens < 1 || c.SystemTokens < 0 || c.Think < 0 {
		return nil, fmt.Errorf("multiturn: chats, turns, question and output tokens must be positive")
	}
	var starts []time.Duration
	if c.ChatRate > 0 {
		starts = PoissonArrivals(c.Chats, c.ChatRate, c.Seed)
	}
	w := &Workload{Name: "multiturn", Chats: make([]Chat, c.Chats)}
	for i := range w.Chats {
		ch := Chat{ID: i, System: TextTokens(3, uint64(i), c.SystemTokens), Think: c.Think,
			MaxTokens: MaxTokensFor(c.OutputTokens, maxTokensCap)}
		if starts != nil {
			ch.Start = starts[i]
		}
		for t := range c.Turns {
			ch.Questions = append(ch.Questions, TextTokens(4, uint64(i*c.Turns+t), c.QuestionTokens))
		}
		w.Chats[i] = ch
	}
	return w, nil
}
