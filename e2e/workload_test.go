package e2e

import (
	"context"
	"errors"
	"hash/fnv"
	"math/rand/v2"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// ---------------------------------------------------------------- prompts

var vocab = strings.Fields(`cache router prefix replica worker token block leader follower raft
quorum lease route load balance stream decode prefill latency shard index placement snapshot
commit apply heartbeat election vote term batch queue window budget retry breaker health probe
metric gauge counter histogram sample answer question context system assistant user tool model
vector matrix kernel tensor layer weight bias gradient epoch dataset corpus document paragraph`)

func seedOf(parts ...string) uint64 {
	h := fnv.New64a()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return h.Sum64()
}

// text returns about n characters of deterministic filler for seed.
func text(seed uint64, n int) string {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var sb strings.Builder
	for sb.Len() < n {
		sb.WriteString(vocab[r.IntN(len(vocab))])
		sb.WriteByte(' ')
	}
	return sb.String()[:n]
}

// groupPrefix is the shared prefix of one group: label and group number
// first, so two groups (or two runs) never share even their first block.
func groupPrefix(label string, g, chars int) string {
	head := "[" + label + " group " + itoa(g) + "] "
	return head + text(seedOf(label, itoa(g)), chars-len(head))
}

// suffix is a request's own tail after the group prefix.
func suffix(label string, g, i int) string {
	return " Question " + itoa(i) + ": " + text(seedOf(label, itoa(g), itoa(i)), 60)
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	neg := i < 0
	if neg {
		i = -i
	}
	var b [20]byte
	p := len(b)
	for i > 0 {
		p--
		b[p] = byte('0' + i%10)
		i /= 10
	}
	if neg {
		p--
		b[p] = '-'
	}
	return string(b[p:])
}

// ---------------------------------------------------------------- clients

// oneShotHTTP opens a new TCP connection per request, so an L4 balancer
// in roundrobin mode spreads requests (not long-lived connections) over
// its backends; every topology under comparison gets the same client.
func oneShotHTTP() *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 3 * time.Second}).DialContext,
		DisableKeepAlives:   true,
		MaxIdleConnsPerHost: -1,
	}}
}

// keepAliveHTTP reuses connections (latency measurements, streams).
func keepAliveHTTP() *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 3 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
	}}
}

// newClient is the official OpenAI client with SDK retries off: a retried
// request would hide exactly the client-visible errors these tests count.
func newClient(base string, hc *http.Client) openai.Client {
	return openai.NewClient(
		option.WithBaseURL(base+"/v1/"),
		option.WithAPIKey("e2e"),
		option.WithHTTPClient(hc),
		option.WithMaxRetries(0),
		option.WithRequestTimeout(30*time.Second),
	)
}

type result struct {
	start, end     time.Time
	err            error
	prompt, cached int64
	replica        string // X-Sim-Replica of the answer
}

func chatParams(prompt string, maxTokens int64) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:     "cart-sim",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
		MaxTokens: openai.Int(maxTokens),
	}
}

// chat sends one non-streaming chat completion and records its usage.
func chat(ctx context.Context, c openai.Client, prompt string, maxTokens int64) result {
	r := result{start: time.Now()}
	var raw *http.Response
	resp, err := c.Chat.Completions.New(ctx, chatParams(prompt, maxTokens), option.WithResponseInto(&raw))
	r.end = time.Now()
	if raw != nil {
		r.replica = raw.Header.Get("X-Sim-Replica")
	}
	if err != nil {
		r.err = err
		return r
	}
	r.prompt = resp.Usage.PromptTokens
	r.cached = resp.Usage.PromptTokensDetails.CachedTokens
	if r.prompt == 0 {
		r.err = errors.New("answer without usage.prompt_tokens")
	}
	return r
}

func hitRatio(rs []result) float64 {
	var p, c int64
	for _, r := range rs {
		p += r.prompt
		c += r.cached
	}
	if p == 0 {
		return 0
	}
	return float64(c) / float64(p)
}

// runBounded calls fn(i) for i in [0, n) with at most conc in flight.
func runBounded(n, conc int, fn func(i int)) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, conc)
	for i := 0; i < n; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			fn(i)
		}()
	}
	wg.Wait()
}

// ---------------------------------------------------------------- streams

// stream is one streaming chat completion run in the background.
type stream struct {
	via     string // which router the client connected to
	replica string
	chunks  int
	finish  string
	err     error
	started chan struct{} // closed at the first chunk (or on failure)
	done    chan struct{}
}

func (s *stream) ok() bool { return s.err == nil && s.finish != "" }

func startStream(ctx context.Context, c openai.Client, via, prompt string, maxTokens int64) *stream {
	s := &stream{via: via, started: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		var once sync.Once
		first := func() { once.Do(func() { close(s.started) }) }
		defer first()
		var raw *http.Response
		// NewStreaming returns once the response headers are in.
		st := c.Chat.Completions.NewStreaming(ctx, chatParams(prompt, maxTokens), option.WithResponseInto(&raw))
		defer st.Close()
		if raw != nil {
			s.replica = raw.Header.Get("X-Sim-Replica")
		}
		for st.Next() {
			ch := st.Current()
			s.chunks++
			for _, choice := range ch.Choices {
				if choice.FinishReason != "" {
					s.finish = choice.FinishReason
				}
			}
			first()
		}
		s.err = st.Err()
	}()
	return s
}

// waitStarted waits for every stream's first chunk; it reports false if
// within passes first or a stream ended before its first chunk.
func waitStarted(ss []*stream, within time.Duration) bool {
	deadline := time.After(within)
	for _, s := range ss {
		select {
		case <-s.started:
		case <-deadline:
			return false
		}
		select {
		case <-s.done:
			if s.chunks == 0 {
				return false
			}
		default:
		}
	}
	return true
}

func waitDone(ss []*stream, within time.Duration) bool {
	deadline := time.After(within)
	for _, s := range ss {
		select {
		case <-s.done:
		case <-deadline:
			return false
		}
	}
	return true
}

// ---------------------------------------------------------------- statistics

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	idx := int(p*float64(len(s))+0.5) - 1
	idx = max(0, min(idx, len(s)-1))
	return s[idx]
}
