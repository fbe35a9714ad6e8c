package bench

import (
	"math"
	"sort"
	"strconv"
	"time"
)

// Percentile returns the p-th percentile (0-100) of xs by linear
// interpolation between the closest ranks (NumPy's default). xs need not be
// sorted and is not modified. It returns NaN for an empty slice.
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return percentileSorted(s, p)
}

func percentileSorted(s []float64, p float64) float64 {
	if len(s) == 0 {
		return math.NaN()
	}
	p = math.Max(0, math.Min(100, p))
	pos := p / 100 * float64(len(s)-1)
	lo := int(math.Floor(pos))
	hi := int(math.Ceil(pos))
	if lo == hi {
		return s[lo]
	}
	frac := pos - float64(lo)
	return s[lo] + (s[hi]-s[lo])*frac
}

// Record is the outcome of one request.
type Record struct {
	ID int `json:"id"`
	// Chat and Turn identify multiturn requests (-1 otherwise).
	Chat int `json:"chat"`
	Turn int `json:"turn"`
	// ScheduledMs and SentMs are offsets from the run start; their
	// difference is dispatch lag (scheduler or concurrency-cap delay).
	ScheduledMs float64 `json:"scheduled_ms"`
	SentMs      float64 `json:"sent_ms"`
	// TTFTMs is the time to the first content token; E2EMs the time to the
	// end of the stream.
	TTFTMs float64 `json:"ttft_ms"`
	E2EMs  float64 `json:"e2e_ms"`
	Status int     `json:"status"`
	Error  string  `json:"error,omitempty"`
	// Replica comes from X-Sim-Replica (or X-Routed-Peer).
	Replica          string `json:"replica,omitempty"`
	PromptTokens     int    `json:"prompt_tokens"`
	CachedTokens     int    `json:"cached_tokens"`
	CompletionTokens int    `json:"completion_tokens"`
	// UsageFrom says where the token counts came from: "usage" or "headers".
	UsageFrom string `json:"usage_from,omitempty"`
	// OraclePromptTokens and OracleCachedTokens are the oracle's view.
	OraclePromptTokens int `json:"oracle_prompt_tokens"`
	OracleCachedTokens int `json:"oracle_cached_tokens"`
	// CapDelayed is true when the concurrency cap held the request back.
	CapDelayed bool `json:"cap_delayed,omitempty"`
}

// OK reports whether the request completed successfully.
func (r *Record) OK() bool { return r.Error == "" && r.Status >= 200 && r.Status < 300 }

// Latency holds latency percentiles in milliseconds.
type Latency struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Mean float64 `json:"mean"`
	Max  float64 `json:"max"`
}

func latencyOf(xs []float64) Latency {
	if len(xs) == 0 {
		return Latency{}
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	var sum float64
	for _, x := range s {
		sum += x
	}
	return Latency{
		P50: percentileSorted(s, 50), P90: percentileSorted(s, 90), P99: percentileSorted(s, 99),
		Mean: sum / float64(len(s)), Max: s[len(s)-1],
	}
}

// Summary is the aggregate of a run.
type Summary struct {
	Requests  int `json:"requests"`
	Succeeded int `json:"succeeded"`
	Errors    int `json:"errors"`
	// ErrorKinds counts errors by status or message.
	ErrorKinds map[string]int `json:"error_kinds,omitempty"`
	// CapDelayed counts requests the concurrency cap held back.
	CapDelayed int `json:"cap_delayed"`
	// NotSent counts requests never sent because the run timed out.
	NotSent int `json:"not_sent"`

	PromptTokens     int64 `json:"prompt_tokens"`
	CachedTokens     int64 `json:"cached_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	// HitRatio is Σcached/Σprompt tokens over successful requests.
	HitRatio float64 `json:"hit_ratio"`
	// OracleHitRatio is the hit ratio of one pool-sized LRU cache over the
	// same request sequence (all sent requests).
	OracleHitRatio float64 `json:"oracle_hit_ratio"`
	// HitVsOracle is HitRatio/OracleHitRatio.
	HitVsOracle float64 `json:"hit_vs_oracle"`

	TTFTMs     Latency `json:"ttft_ms"`
	E2EMs      Latency `json:"e2e_ms"`
	DispatchMs Latency `json:"dispatch_lag_ms"`

	DurationS float64 `json:"duration_s"`
	// ReqPerS is successful requests per second of wall time (first send to
	// last completion).
	ReqPerS float64 `json:"req_per_s"`
	// TokensPerS counts prompt and completion tokens; OutputTokensPerS only
	// completion tokens.
	TokensPerS       float64 `json:"tokens_per_s"`
	OutputTokensPerS float64 `json:"output_tokens_per_s"`

	// PerReplica counts successful requests by replica.
	PerReplica map[string]int `json:"per_replica"`
	// Imbalance is max/mean of PerReplica (replicas that got nothing count
	// as 0 when the pool's names are known). 1 is perfectly even.
	Imbalance float64 `json:"imbalance"`
}

// Summarize aggregates records. replicas, if given, lists every replica of
// the pool so that idle ones count in the imbalance.
func Summarize(recs []Record, replicas []string) Summary {
	s := Summary{Requests: len(recs), PerReplica: map[string]int{}}
	for _, name := range replicas {
		s.PerReplica[name] = 0
	}
	var ttft, e2e, lag []float64
	var oraclePrompt, oracleCached int64
	first, last := math.Inf(1), math.Inf(-1)
	for i := range recs {
		r := &recs[i]
		if r.CapDelayed {
			s.CapDelayed++
		}
		if r.Status == 0 && r.Error == errNotSent {
			s.NotSent++
		}
		if r.Status != 0 || r.Error != errNotSent {
			oraclePrompt += int64(r.OraclePromptTokens)
			oracleCached += int64(r.OracleCachedTokens)
			lag = append(lag, r.SentMs-r.ScheduledMs)
			first = math.Min(first, r.SentMs)
			last = math.Max(last, r.SentMs+r.E2EMs)
		}
		if !r.OK() {
			s.Errors++
			if s.ErrorKinds == nil {
				s.ErrorKinds = map[string]int{}
			}
			s.ErrorKinds[errorKind(r)]++
			continue
		}
		s.Succeeded++
		s.PromptTokens += int64(r.PromptTokens)
		s.CachedTokens += int64(r.CachedTokens)
		s.CompletionTokens += int64(r.CompletionTokens)
		ttft = append(ttft, r.TTFTMs)
		e2e = append(e2e, r.E2EMs)
		name := r.Replica
		if name == "" {
			name = "unknown"
		}
		s.PerReplica[name]++
	}
	if s.PromptTokens > 0 {
		s.HitRatio = float64(s.CachedTokens) / float64(s.PromptTokens)
	}
	if oraclePrompt > 0 {
		s.OracleHitRatio = float64(oracleCached) / float64(oraclePrompt)
	}
	if s.OracleHitRatio > 0 {
		s.HitVsOracle = s.HitRatio / s.OracleHitRatio
	}
	s.TTFTMs = latencyOf(ttft)
	s.E2EMs = latencyOf(e2e)
	s.DispatchMs = latencyOf(lag)
	if last > first {
		s.DurationS = (last - first) / 1000
		s.ReqPerS = float64(s.Succeeded) / s.DurationS
		s.TokensPerS = float64(s.PromptTokens+s.CompletionTokens) / s.DurationS
		s.OutputTokensPerS = float64(s.CompletionTokens) / s.DurationS
	}
	s.Imbalance = Imbalance(s.PerReplica)
	return s
}

// Imbalance is max/mean of the counts (0 when there are none).
func Imbalance(counts map[string]int) float64 {
	if len(counts) == 0 {
		return 0
	}
	total, mx := 0, 0
	for _, c := range counts {
		total += c
		mx = max(mx, c)
	}
	if total == 0 {
		return 0
	}
	return float64(mx) / (float64(total) / float64(len(counts)))
}

const errNotSent = "not sent: run timed out"

func errorKind(r *Record) string {
	switch {
	case r.Error == errNotSent:
		return "not_sent"
	case r.Status >= 400:
		return "http_" + strconv.Itoa(r.Status)
	case r.Error != "":
		msg := r.Error
		if len(msg) > 60 {
			msg = msg[:60]
		}
		return msg
	default:
		return "status_" + strconv.Itoa(r.Status)
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
