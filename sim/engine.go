package sim

import (
	"context"
	"encoding/json"
	"hash/fnv"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/cartrouter/cart/internal/every"
)

// job is one inference request as the engine sees it.
type job struct {
	requestID    string // the client's X-Request-Id, if any
	model        string
	adapter      string // the LoRA adapter the model name selects, if any
	prompt       []byte
	promptTokens int
	hashes       []uint64 // chained hashes of the prompt's full blocks

	maxTokens int  // output tokens to generate
	capped    bool // the client set the limit, so stopping there is "length"
	stream    bool
	// includeUsage asks for a final usage chunk in an OpenAI stream.
	includeUsage bool

	cachedTokens int // set by admit
	// priority is the request's "priority" field (vLLM: lower runs first
	// under the priority scheduling policy).
	priority int
	// remoteDecode: a prefill leg (pd.go); pull: a decode leg's transfer.
	remoteDecode bool
	pull         *kvParams
}

// newJob prepares the engine's view of a rendered prompt, or answers vLLM's
// 404 when the replica does not serve the model (400 for an empty
// cache_salt, as vLLM's request validation does).
// Its output length comes from the first of limits the client set (see
// outputBudget).
func (s *Server) newJob(r *http.Request, model string, salt *string, prompt []byte, stream bool, limits ...namedLimit) (*job, *apiError) {
	adapter, ok := s.models.resolve(model)
	if !ok {
		return nil, modelNotFound(model)
	}
	if salt != nil && *salt == "" {
		return nil, badRequest("Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt")
	}
	if model == "" {
		model = s.cfg.Model
	}
	j := &job{
		requestID:    r.Header.Get("X-Request-Id"),
		model:        model,
		adapter:      adapter,
		prompt:       prompt,
		promptTokens: tokenCount(prompt),
		hashes:       blockHashes(prompt, s.cfg.BlockTokens, adapter, deref(salt)),
		stream:       stream,
	}
	return j, s.outputBudget(j, limits...)
}

// textSeed derives the filler-text seed from the replica seed and the prompt,
// so identical requests get identical answers and different prompts do not.
func (s *Server) textSeed(j *job) uint64 {
	h := fnv.New64a()
	_, _ = h.Write(j.prompt)
	return h.Sum64() ^ uint64(s.cfg.Seed)
}

// outputBudget picks the output length from the first limit the client set
// (callers list fields by precedence), or the configured default.
func (s *Server) outputBudget(j *job, limits ...namedLimit) *apiError {
	for _, l := range limits {
		if l.v == nil {
			continue
		}
		if *l.v < 1 {
			return badRequest(l.name+" must be at least 1", l.name)
		}
		j.maxTokens = min(*l.v, MaxOutputTokens)
		j.capped = true
		return nil
	}
	j.maxTokens = s.cfg.OutputTokens
	return nil
}

type namedLimit struct {
	name string
	v    *int
}

// admit runs a job through the prefill stage: it waits in FIFO order for a
// prefill slot, looks the prompt up in the prefix cache, spends the prefill
// time on the uncached tokens and inserts the prompt's blocks. The lookup is
// done on admission, not arrival, because that is when a real scheduler
// allocates blocks; the insert is done at the end because a block's KV only
// exists once it has been computed.
//
// On success the job counts as running until the returned func is called.
// On failure (ctx ended) nothing is left held.
func (s *Server) admit(ctx context.Context, j *job) (func(), error) {
	s.queued.Add(1)
	if err := s.seqs.acquire(ctx, j.priority); err != nil {
		s.queued.Add(-1)
		return nil, err
	}
	err := s.slots.Acquire(ctx, 1)
	s.queued.Add(-1)
	if err != nil {
		s.seqs.release()
		return nil, err
	}
	s.running.Add(1)

	matched := s.cache.match(j.hashes)
	j.cachedTokens = min(matched*s.cfg.BlockTokens, j.promptTokens)
	if s.hooks.prefillStart != nil {
		s.hooks.prefillStart(j)
	}
	uncached := j.promptTokens - j.cachedTokens
	err = every.Sleep(ctx, s.scaled(float64(uncached)*s.cfg.PrefillUsPerToken, time.Microsecond))
	if err == nil {
		s.cache.insert(j.hashes, s.cacheChanged(j))
		s.promptTokens.Add(int64(j.promptTokens))
		s.cachedTokens.Add(int64(j.cachedTokens))
		if s.hooks.prefillEnd != nil {
			s.hooks.prefillEnd(j)
		}
	}
	s.slots.Release(1)
	if err != nil {
		s.running.Add(-1)
		s.seqs.release()
		return nil, err
	}
	return func() { s.running.Add(-1); s.seqs.release() }, nil
}

// scaled converts an amount of unit into a duration multiplied by TimeScale,
// saturating instead of overflowing for absurd configurations.
func (s *Server) scaled(amount float64, unit time.Duration) time.Duration {
	ns := amount * s.cfg.TimeScale * float64(unit)
	if ns >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(ns)
}

// decoder paces output tokens.
type decoder struct {
	s   *Server
	ctx context.Context
	// due is when the previous token was scheduled to finish. Sleeping until
	// a running deadline, rather than for a fixed delay per token, keeps
	// timer and write overhead from accumulating over long outputs.
	due time.Time
}

func (s *Server) newDecoder(ctx context.Context) *decoder { return &decoder{s: s, ctx: ctx} }

// step waits for one output token. Its cost is recomputed from the current
// number of running requests, so a stream slows down as others join it, as
// a shared decode batch does.
func (d *decoder) step() error {
	delay := d.s.decodeDelay(d.s.running.Load())
	now := time.Now()
	if d.due.IsZero() || d.due.Before(now.Add(-delay)) {
		// First token, or we fell more than a token behind (a slow client):
		// restart the schedule instead of bursting to catch up.
		d.due = now
	}
	d.due = d.due.Add(delay)
	if err := every.Sleep(d.ctx, time.Until(d.due)); err != nil {
		return err
	}
	d.s.completionTokens.Add(1)
	return nil
}

// decodeDelay is the time one output token takes with running requests in
// the engine (including the caller).
func (s *Server) decodeDelay(running int64) time.Duration {
	others := float64(max(running-1, 0))
	return s.scaled(s.cfg.DecodeMsPerToken*(1+s.cfg.DecodeSlowdown*others), time.Millisecond)
}

// Response headers the simulator adds, for benchmarks to read.
const (
	// HeaderReplica names the replica that answered (every response).
	HeaderReplica = "X-Sim-Replica"
	// HeaderPromptTokens and HeaderCachedTokens carry a completion's
	// prompt tokens and how many of them hit the prefix cache.
	HeaderPromptTokens = "X-Sim-Prompt-Tokens"
	HeaderCachedTokens = "X-Sim-Cached-Tokens"
)

// setUsageHeaders exposes the cache outcome before the body, so routers and
// benchmarks can read it whether or not the client asked for usage.
func setUsageHeaders(w http.ResponseWriter, j *job) {
	h := w.Header()
	h.Set(HeaderPromptTokens, strconv.Itoa(j.promptTokens))
	h.Set(HeaderCachedTokens, strconv.Itoa(j.cachedTokens))
}

// sseWriter writes server-sent events, flushing each one so the client sees
// tokens as they are generated.
type sseWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf []byte
}

// startSSE sends the response headers at once: for a stream they are the
// first byte the client sees, and they carry the X-Sim-* usage headers.
func startSSE(w http.ResponseWriter) (*sseWriter, error) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // keep buffering proxies from batching tokens
	w.WriteHeader(http.StatusOK)
	sw := &sseWriter{w: w, rc: http.NewResponseController(w)}
	return sw, sw.rc.Flush()
}

// event sends one event; name may be empty for OpenAI's unnamed events.
func (sw *sseWriter) event(name string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		panic("sim: encoding stream event: " + err.Error()) // our own types only
	}
	return sw.send(name, data)
}

func (sw *sseWriter) send(name string, data []byte) error {
	sw.buf = sw.buf[:0]
	if name != "" {
		sw.buf = append(sw.buf, "event: "...)
		sw.buf = append(sw.buf, name...)
		sw.buf = append(sw.buf, '\n')
	}
	sw.buf = append(sw.buf, "data: "...)
	sw.buf = append(sw.buf, data...)
	sw.buf = append(sw.buf, "\n\n"...)
	if _, err := sw.w.Write(sw.buf); err != nil {
		return err
	}
	return sw.rc.Flush()
}

// generate decodes n tokens of text at the decoder's pace and returns
// them as one string, for non-streamed answers.
func (d *decoder) generate(text *fillerText, n int) (string, error) {
	var out strings.Builder
	for range n {
		if err := d.step(); err != nil {
			return "", err
		}
		out.WriteString(text.next())
	}
	return out.String(), nil
}

// deref is *p, "" for nil.
func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
