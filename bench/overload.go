package bench

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/openai/openai-go/v3/option"
)

// The overload benchmark: what a tenant with interactive traffic sees when
// another floods the pool. Replicas are cart-sim engines with a batch limit
// (--max-num-seqs) and a waiting queue of their own, as vLLM has. A calm
// tenant sends streamed chats at a steady rate; flooding tenants keep a
// number of requests in flight. Each target is measured twice, the calm
// tenant alone and under the flood, and the ratio of the calm tenant's TTFT
// p99 is the headline figure.

// OverloadConfig sizes the benchmark.
type OverloadConfig struct {
	Replicas int `json:"replicas"`
	// Seqs is each engine's batch limit; OutputTokens (the mean of a
	// uniform spread of ±OutputSpread) and DecodeMsPerToken make a
	// request's run time (~OutputTokens x DecodeMsPerToken).
	Seqs             int     `json:"seqs"`
	OutputTokens     int     `json:"output_tokens"`
	OutputSpread     float64 `json:"output_spread"`
	DecodeMsPerToken float64 `json:"decode_ms_per_token"`
	// DecodeSlowdown is cart-sim's --decode-slowdown: each other running
	// sequence adds this fraction to a token's time. 0 by default, as
	// llm-d-inference-sim's default time-factor-under-load of 1 (the
	// issue's engines, whose sequences take ~280 ms); the runs recorded
	// before the flag had 0.05, which makes a full batch of four decode
	// 15% slower (~320 ms a sequence).
	DecodeSlowdown    float64 `json:"decode_slowdown"`
	PrefillUsPerToken float64 `json:"prefill_us_per_token"`
	// SystemTokens is the length of each tenant's shared system prompts
	// (Prompts of them per tenant), so the cache matters.
	SystemTokens int `json:"system_tokens"`
	Prompts      int `json:"prompts"`
	// CalmRate is the calm tenant's requests per second (Poisson);
	// FloodConcurrency what each flooding tenant keeps in flight.
	CalmRate         float64 `json:"calm_rate"`
	FloodConcurrency int     `json:"flood_concurrency"`
	// ReserveSlots is flow.reserve_slots in the priority and shed
	// scenarios: the slots per worker kept for the calm tenant's priority.
	ReserveSlots int `json:"reserve_slots"`
	// Seed picks the tenants' arrivals, output lengths and questions: one
	// seed samples one set of bursts, so a figure near its bound needs
	// several seeds (0 is the runs recorded before the flag).
	Seed uint64 `json:"seed"`
	// Measure is each measured window; Warmup the flood's head start
	// before its window (the router learns the engines' concurrency).
	Measure time.Duration `json:"measure_ns"`
	Warmup  time.Duration `json:"warmup_ns"`
	// Scenarios and Targets to run (OverloadScenarios, OverloadTargets).
	Scenarios []string `json:"scenarios"`
	Targets   []string `json:"targets"`
}

// DefaultOverload is the setup: two replicas of four sequences of
// ~280 ms, a calm tenant at 2 chats/s, a flood of 32 in flight.
func DefaultOverload() OverloadConfig {
	return OverloadConfig{Replicas: 2, Seqs: 4, OutputTokens: 28, OutputSpread: 0.5, DecodeMsPerToken: 10, PrefillUsPerToken: 20,
		SystemTokens: 512, Prompts: 8, CalmRate: 2, FloodConcurrency: 32, ReserveSlots: 1,
		Measure: 40 * time.Second, Warmup: 5 * time.Second,
		Scenarios: []string{"flood", "priority", "two-floods", "shed"},
		Targets:   []string{"nginx-lc", "cart-noqueue", "cart", "cart-2dp"}}
}

// OverloadScenarios are the scenarios, by name.
var OverloadScenarios = []string{"flood", "priority", "two-floods", "shed"}

// OverloadTargets are the routers a scenario can run through. The
// priority, two-floods and shed scenarios need CART's flow control, so
// only its targets run them.
var OverloadTargets = []string{"nginx-lc", "cart-noqueue", "cart", "cart-2dp-noqueue", "cart-2dp"}

// TenantFigures is one tenant's side of a window.
type TenantFigures struct {
	Requests  int     `json:"requests"`
	Errors    int     `json:"errors"` // answers other than 200 and 429
	Refused   int     `json:"refused"`
	TTFTP50Ms float64 `json:"ttft_p50_ms"`
	TTFTP90Ms float64 `json:"ttft_p90_ms"`
	TTFTP99Ms float64 `json:"ttft_p99_ms"`
	// Tokens are prompt + completion tokens of the requests served.
	Tokens           int     `json:"tokens"`
	CompletionTokens int     `json:"completion_tokens"`
	PromptTokens     int     `json:"prompt_tokens"`
	CachedTokens     int     `json:"cached_tokens"`
	ReqPerS          float64 `json:"req_per_s"`
}

// OverloadRun is one scenario through one target.
type OverloadRun struct {
	Scenario string `json:"scenario"`
	Target   string `json:"target"`
	Status   string `json:"status"`
	Reason   string `json:"reason,omitempty"`
	// Alone is the calm tenant by itself; Loaded every tenant during
	// the flood.
	Alone  TenantFigures            `json:"alone"`
	Loaded map[string]TenantFigures `json:"loaded"`
	// CalmP99Ratio is the calm tenant's TTFT p99 under the flood over
	// its p99 alone.
	CalmP99Ratio float64 `json:"calm_p99_ratio"`
	// NextEndP50/P90/P99Ms: for each calm request under the flood, the
	// time from its start to the next end of any other request, seen by
	// the clients. The pool is full then (the flood keeps more in flight
	// than it runs), so no scheduler that neither preempts nor keeps a
	// slot idle can start the calm request sooner (give or take the
	// delivery of that response's last bytes), and its first token comes
	// on top: its TTFT percentiles are above these.
	NextEndP50Ms float64 `json:"next_end_p50_ms"`
	NextEndP90Ms float64 `json:"next_end_p90_ms"`
	NextEndP99Ms float64 `json:"next_end_p99_ms"`
	// TokensPerS is every tenant's tokens served per second during the
	// flood; HitRatio cached / prompt tokens then.
	TokensPerS float64 `json:"tokens_per_s"`
	HitRatio   float64 `json:"hit_ratio"`
	// HitRatioLate is the hit ratio of the window's second half: the
	// copies of a prompt to a second replica are made once, mostly early
	// in the window, so this is the steady state the whole window's
	// figure converges to.
	HitRatioLate float64 `json:"hit_ratio_late"`
	// Shares is each flooding tenant's share of the flood tenants' tokens
	// (two-floods).
	Shares map[string]float64 `json:"shares,omitempty"`
	// Engine is what the replicas' own waiting queues saw during the
	// flood window (vLLM's request_queue_time_seconds, summed over them):
	// with CART's queue in front, a request that waits in an engine was
	// sent to a replica with no free sequence.
	Engine EngineQueue `json:"engine_queue"`
	// RouterMetrics are CART's flow-control counters after the run.
	RouterMetrics map[string]float64 `json:"router_metrics,omitempty"`
}

// EngineQueue is the requests the engines admitted in a window and those
// of them that waited in an engine's own queue for more than a
// millisecond (the histogram's first bucket), with their total wait and
// the longest wait's bucket bound.
type EngineQueue struct {
	Admitted  float64 `json:"admitted"`
	Waited    float64 `json:"waited"`
	WaitSumMs float64 `json:"wait_sum_ms"`
	WaitMaxMs float64 `json:"wait_max_ms"` // upper bound of the longest wait's bucket; +Inf is written as -1
}

// engineQueue turns two scrapes of the replicas' queue-time histograms
// (one series each, summed) into the window's figures.
func engineQueue(before, after *Histogram) EngineQueue {
	if after == nil {
		return EngineQueue{}
	}
	d := after.Sub(before)
	q := EngineQueue{Admitted: d.Count, WaitSumMs: 1000 * d.Sum, WaitMaxMs: 1000 * d.MaxBound()}
	if math.IsInf(q.WaitMaxMs, 1) {
		q.WaitMaxMs = -1
	}
	q.Waited = d.Count
	if len(d.Bounds) > 0 && d.Bounds[0] <= 0.001 {
		q.Waited -= d.Counts[0]
	}
	return q
}

// engineQueueTimes sums the replicas' vllm:request_queue_time_seconds
// (nil unless every replica answered, with the same buckets: a partial sum
// would undercount the waits).
func (s *suite) engineQueueTimes() *Histogram {
	ports := make([]int, len(s.replicas))
	for i, r := range s.replicas {
		ports[i] = r.port
	}
	pages := s.metricsPages(ports)
	if len(pages) != len(ports) {
		return nil
	}
	var sum *Histogram
	for _, page := range pages {
		for _, h := range ParseHistograms(page, "vllm:request_queue_time_seconds") {
			if sum = sum.Add(h); sum == nil {
				return nil
			}
		}
	}
	return sum
}

// OverloadResult is results.json of the benchmark.
type OverloadResult struct {
	StartedAt time.Time      `json:"started_at"`
	Config    OverloadConfig `json:"config"`
	Machine   MachineInfo    `json:"machine"`
	Runs      []OverloadRun  `json:"runs"`
}

// tenantPlan is one tenant's load in a scenario.
type tenantPlan struct {
	name  string
	key   string
	rate  float64 // open loop (req/s) when > 0
	conc  int     // closed loop otherwise
	front int     // index of the data plane to send to (distributed two-floods), -1 = the front
	// priority, maxPriority, weight: the key's flow settings.
	priority int
}

func overloadPlan(sc string, c OverloadConfig) (calm tenantPlan, floods []tenantPlan, extra string) {
	calm = tenantPlan{name: "calm", key: "calm-key-0123456789", rate: c.CalmRate, front: -1}
	flood := tenantPlan{name: "flood", key: "flood-key-0123456789", conc: c.FloodConcurrency, front: -1}
	switch sc {
	case "priority":
		calm.priority = 5
		extra = fmt.Sprintf("flow:\n  reserve_priority: 5\n  reserve_slots: %d\n  engine_priority: true\n", c.ReserveSlots)
	case "shed":
		calm.priority = 5
		flood.priority = -1
		extra = fmt.Sprintf("flow:\n  reserve_priority: 5\n  reserve_slots: %d\n", c.ReserveSlots)
	case "two-floods":
		a := tenantPlan{name: "flood-a", key: "flood-a-key-0123456789", conc: c.FloodConcurrency / 2, front: 0}
		b := tenantPlan{name: "flood-b", key: "flood-b-key-0123456789", conc: c.FloodConcurrency * 3 / 2, front: 1}
		return calm, []tenantPlan{a, b}, ""
	}
	return calm, []tenantPlan{flood}, extra
}

// keysYAML is the auth section naming every tenant's key.
func keysYAML(ts []tenantPlan) string {
	var b strings.Builder
	b.WriteString("auth:\n  client_keys:\n")
	for _, t := range ts {
		fmt.Fprintf(&b, "    - {name: %s, key: %s, priority: %d}\n", t.name, t.key, t.priority)
	}
	return b.String()
}

// RunOverload runs the benchmark and writes results.json and README.md
// into out.
func RunOverload(ctx context.Context, repoRoot, out string, c OverloadConfig, log io.Writer) (*OverloadResult, error) {
	sc := DefaultSuiteConfig(repoRoot)
	sc.Replicas = c.Replicas
	sc.Sim = SimConfig{BlockTokens: 16, PrefillUsPerToken: c.PrefillUsPerToken, DecodeMsPerToken: c.DecodeMsPerToken,
		DecodeSlowdown: c.DecodeSlowdown, MaxConcurrency: c.Seqs, TimeScale: 1, MaxRunning: c.Seqs, OutputTokens: c.OutputTokens}
	env, err := NewEnv(sc, log)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	sc.OutDir = out
	s := &suite{env: env, cfg: sc, cartBin: filepath.Join(sc.BinDir, "cart"), simBin: filepath.Join(sc.BinDir, "cart-sim")}
	s.nginx, _ = exec.LookPath("nginx")
	s.haproxy, _ = exec.LookPath("haproxy")
	for _, b := range []string{s.cartBin, s.simBin} {
		if _, err := os.Stat(b); err != nil {
			return nil, fmt.Errorf("%s missing: run make build first", b)
		}
	}
	res := &OverloadResult{StartedAt: time.Now().UTC(), Config: c, Machine: CollectMachineInfo()}
	for _, scName := range c.Scenarios {
		for _, target := range c.Targets {
			if scName != "flood" && !strings.HasPrefix(target, "cart") || scName != "flood" && strings.HasSuffix(target, "noqueue") {
				continue // needs flow control
			}
			run := s.overloadRun(ctx, c, scName, target)
			env.Logf("%s via %s: %s calm p99 alone %.0f ms, flood %.0f ms (%.1fx), %.0f tok/s, hit %.3f %s",
				scName, target, run.Status, run.Alone.TTFTP99Ms, run.Loaded["calm"].TTFTP99Ms, run.CalmP99Ratio, run.TokensPerS, run.HitRatio, run.Reason)
			res.Runs = append(res.Runs, run)
			if ctx.Err() != nil {
				return res, ctx.Err()
			}
		}
	}
	res.Machine.LoadAvgEnd = LoadAvg()
	return res, writeResults(out, res, FormatOverload(res))
}

func (s *suite) overloadRun(ctx context.Context, c OverloadConfig, scName, target string) (run OverloadRun) {
	run = OverloadRun{Scenario: scName, Target: target, Status: "ok", Loaded: map[string]TenantFigures{}}
	calm, floods, extra := overloadPlan(scName, c)
	all := append([]tenantPlan{calm}, floods...)
	s.extra = keysYAML(all) + extra
	if strings.HasSuffix(target, "noqueue") {
		s.extra += "flow:\n  enabled: false\n"
	}
	s.cfg.Sim.SchedulingPolicy = ""
	if strings.Contains(extra, "engine_priority: true") {
		s.cfg.Sim.SchedulingPolicy = "priority"
	}
	if err := s.startReplicas(ctx); err != nil {
		return OverloadRun{Scenario: scName, Target: target, Status: "skipped", Reason: err.Error()}
	}
	defer s.stopReplicas()
	dir := s.env.Path("overload__" + scName + "__" + target)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return OverloadRun{Scenario: scName, Target: target, Status: "failed", Reason: err.Error()}
	}
	var d deployment
	var err error
	switch target {
	case "nginx-lc":
		var ps []*Proc
		d.target, ps, err = s.startNginx(ctx, dir, "nginx-lc", s.replicaAddrs(), true)
		d.procs = ps
	case "cart", "cart-noqueue":
		port, perr := s.env.FreePort()
		if perr != nil {
			err = perr
			break
		}
		d.procs, err = s.startCart(ctx, dir, target, port, "plain")
		d.target, d.routers = baseURL(port), []int{port}
	case "cart-2dp", "cart-2dp-noqueue":
		err = s.startDistributed(ctx, dir, target, 2, &d)
	default:
		err = fmt.Errorf("unknown target %q", target)
	}
	defer func() {
		s.keepLogs(d.procs, scName+"__")
		s.env.StopAll(d.procs)
	}()
	if err != nil {
		run.Status, run.Reason = "skipped", err.Error()
		return run
	}
	fronts := make([]string, 0, len(d.routers))
	for _, p := range d.routers {
		fronts = append(fronts, baseURL(p))
	}
	frontFor := func(t tenantPlan) string {
		if t.front >= 0 && t.front < len(fronts) && len(fronts) > 1 {
			return fronts[t.front]
		}
		return d.target
	}
	hc := NewHTTPClient(4 * c.FloodConcurrency)
	defer hc.CloseIdleConnections()
	sender := func(t tenantPlan) *OpenAISender {
		return NewOpenAISender(frontFor(t), "cart-sim", hc, option.WithAPIKey(t.key))
	}

	// The calm tenant alone.
	alone := newTenantLoad(calm, sender(calm), c, c.Seed*100+1)
	aloneCtx, stopAlone := context.WithTimeout(ctx, c.Measure)
	alone.run(aloneCtx, time.Now())
	stopAlone()
	run.Alone = alone.figures(c.Measure)

	// The flood, then the calm tenant with it.
	floodCtx, stopFlood := context.WithCancel(ctx)
	var loads []*tenantLoad
	var wg sync.WaitGroup
	windowStart := time.Now().Add(c.Warmup)
	for i, f := range floods {
		l := newTenantLoad(f, sender(f), c, c.Seed*100+uint64(10+i))
		loads = append(loads, l)
		wg.Add(1)
		go func() { defer wg.Done(); l.run(floodCtx, windowStart) }()
	}
	select {
	case <-time.After(c.Warmup):
	case <-ctx.Done():
	}
	calmLoaded := newTenantLoad(calm, sender(calm), c, c.Seed*100+2)
	engineBefore := s.engineQueueTimes()
	calmCtx, stopCalm := context.WithTimeout(ctx, c.Measure)
	calmLoaded.run(calmCtx, time.Now())
	stopCalm()
	windowEnd := time.Now()
	run.Engine = engineQueue(engineBefore, s.engineQueueTimes())
	stopFlood()
	wg.Wait()
	run.Loaded["calm"] = calmLoaded.figures(c.Measure)
	var floodTokens int
	tokens, prompt, cached := 0, 0, 0
	for _, l := range append(loads, calmLoaded) {
		l.keepUntil(windowEnd)
		f := l.figures(c.Measure)
		if l.plan.name != "calm" {
			run.Loaded[l.plan.name] = f
			floodTokens += f.Tokens
		}
		tokens += f.Tokens
		prompt += f.PromptTokens
		cached += f.CachedTokens
	}
	run.TokensPerS = float64(tokens) / c.Measure.Seconds()
	if prompt > 0 {
		run.HitRatio = float64(cached) / float64(prompt)
	}
	prompt, cached = 0, 0
	for _, l := range append(loads, calmLoaded) {
		lp, lc := l.promptTokensBetween(windowEnd.Add(-c.Measure/2), windowEnd)
		prompt += lp
		cached += lc
	}
	if prompt > 0 {
		run.HitRatioLate = float64(cached) / float64(prompt)
	}
	if len(loads) > 1 && floodTokens > 0 {
		run.Shares = map[string]float64{}
		for _, l := range loads {
			run.Shares[l.plan.name] = float64(run.Loaded[l.plan.name].Tokens) / float64(floodTokens)
		}
	}
	if run.Alone.TTFTP99Ms > 0 {
		run.CalmP99Ratio = run.Loaded["calm"].TTFTP99Ms / run.Alone.TTFTP99Ms
	}
	if err := writeTTFTCSV(filepath.Join(s.cfg.OutDir, ttftFilePrefix+scName+"__"+target+".csv"), alone.servedTTFTsMs(), calmLoaded.servedTTFTsMs()); err != nil {
		s.env.Logf("calm TTFTs of %s via %s not written: %v", scName, target, err)
	}
	waits := nextEnds(calmLoaded, append(loads, calmLoaded), windowEnd.Add(-c.Measure), windowEnd)
	if err := writeCalmCSV(filepath.Join(s.cfg.OutDir, "calm__"+scName+"__"+target+".csv"), waits); err != nil {
		s.env.Logf("calm requests of %s via %s not written: %v", scName, target, err)
	}
	if err := writeRequestsCSV(filepath.Join(s.cfg.OutDir, "requests__"+scName+"__"+target+".csv.gz"), append(loads, calmLoaded), windowEnd.Add(-c.Measure)); err != nil {
		s.env.Logf("requests of %s via %s not written: %v", scName, target, err)
	}
	if len(waits) > 0 {
		next := make([]float64, len(waits))
		for i, w := range waits {
			next[i] = w.nextEndMs
		}
		run.NextEndP50Ms, run.NextEndP90Ms, run.NextEndP99Ms = Percentile(next, 50), Percentile(next, 90), Percentile(next, 99)
	}
	if len(d.routers) > 0 {
		run.RouterMetrics = s.flowMetrics(d.routers)
	}
	return run
}

// flowMetrics sums the flow-control and fallback counters over the
// routers. In distributed mode the queue's counters are the leader's, which
// data planes do not export: only their fallbacks show.
func (s *suite) flowMetrics(ports []int) map[string]float64 {
	return flowCounters(s.metricsPages(ports))
}

// flowCounters sums the kept counters over the routers' /metrics pages; with
// at least one page, cart_fallback_total is there even when no router fell
// back (a counter vector has no series before its first count).
func flowCounters(pages []string) map[string]float64 {
	names := []string{"cart_flow_enqueued_total", "cart_flow_dispatched_total", "cart_flow_refused_total", "cart_flow_cancelled_total",
		"cart_fallback_total"}
	out := map[string]float64{}
	for _, page := range pages {
		for k, v := range ParseCounters(page, names) {
			out[k] += v
		}
	}
	if len(pages) == 0 {
		return out
	}
	for k := range out {
		if strings.HasPrefix(k, "cart_fallback_total") {
			return out
		}
	}
	out["cart_fallback_total"] = 0
	return out
}

// tenantLoad drives one tenant and records its results.
type tenantLoad struct {
	plan tenantPlan
	send Sender
	c    OverloadConfig
	rng  *rand.Rand
	// seed tells the loads of one tenant apart (alone, under the flood):
	// each asks its own questions, so no prompt of the flood window
	// repeats one of the calm tenant's window alone word for word.
	seed   uint64
	mu     sync.Mutex
	from   time.Time // results finished before are warm-up
	until  time.Time // and after, past the window (zero: none)
	result []timedResult
}

type timedResult struct {
	Result
	end time.Time
}

// servedWithin reports whether r was answered 200 and ended within [from,
// until] (a zero bound is open).
func (r timedResult) servedWithin(from, until time.Time) bool {
	return r.Err == nil && r.Status == http.StatusOK && !r.end.Before(from) && (until.IsZero() || !r.end.After(until))
}

func newTenantLoad(p tenantPlan, s Sender, c OverloadConfig, seed uint64) *tenantLoad {
	return &tenantLoad{plan: p, send: s, c: c, seed: seed, rng: rand.New(rand.NewPCG(seed, uint64(len(p.name))))}
}

// messages picks one of the tenant's system prompts and a fresh question.
func (l *tenantLoad) messages(n uint64) []Message {
	l.mu.Lock()
	doc := l.rng.IntN(max(l.c.Prompts, 1))
	l.mu.Unlock()
	ns := uint64(len(l.plan.name))*1000 + uint64(l.plan.name[len(l.plan.name)-1])
	return []Message{
		{Role: "system", Content: TextTokens(ns, uint64(doc), l.c.SystemTokens)},
		{Role: "user", Content: TextTokens(ns+7, l.seed<<40|n, 24)},
	}
}

// run sends until ctx ends, keeping results that end after from.
func (l *tenantLoad) run(ctx context.Context, from time.Time) {
	l.from = from
	var wg sync.WaitGroup
	var n uint64
	var nmu sync.Mutex
	next := func() uint64 { nmu.Lock(); defer nmu.Unlock(); n++; return n }
	one := func() {
		// Output lengths vary (uniform over ±OutputSpread of
		// OutputTokens, 50% by default), as real answers do: a flood of
		// equal lengths finishes in lockstep, and a calm request that just
		// missed a batch of completions would wait for the whole next one.
		spread := min(max(l.c.OutputSpread, 0), 1)
		lo := int(math.Round(float64(l.c.OutputTokens) * (1 - spread)))
		hi := int(math.Round(float64(l.c.OutputTokens) * (1 + spread)))
		l.mu.Lock()
		tokens := max(1, lo+l.rng.IntN(hi-lo+1))
		l.mu.Unlock()
		r := l.send.Send(ctx, l.messages(next()), tokens, false)
		if ctx.Err() != nil && r.Err != nil {
			return // cut by the end of the run, not an answer
		}
		l.mu.Lock()
		l.result = append(l.result, timedResult{r, time.Now()})
		l.mu.Unlock()
		if r.Status == http.StatusTooManyRequests {
			// A shed client backs off a little rather than spin.
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	if l.plan.rate > 0 {
		for ctx.Err() == nil {
			l.mu.Lock()
			gap := time.Duration(l.rng.ExpFloat64() / l.plan.rate * float64(time.Second))
			l.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(gap):
				wg.Add(1)
				go func() { defer wg.Done(); one() }()
			}
		}
	} else {
		for range l.plan.conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					one()
				}
			}()
		}
	}
	wg.Wait()
}

func (l *tenantLoad) keepUntil(t time.Time) { l.until = t }

// calmWait is one calm request served under the flood: when it started
// (ms into the window), its TTFT, the wait from its start to the next end
// of another request served (ms), and how many other requests had their
// first token while it waited for its own: the slots others took meanwhile
// (one of them may have been started just before it arrived).
type calmWait struct {
	startMs, ttftMs, nextEndMs float64
	othersFirst                int
}

// writeCalmCSV writes ws, one request a line.
func writeCalmCSV(path string, ws []calmWait) error {
	var b strings.Builder
	b.WriteString("start_ms,ttft_ms,next_end_ms,others_first_tokens\n")
	for _, w := range ws {
		fmt.Fprintf(&b, "%.1f,%.1f,%.1f,%d\n", w.startMs, w.ttftMs, w.nextEndMs, w.othersFirst)
	}
	return writeResultFile(path, []byte(b.String()))
}

// nextEnds returns, for each request of calm served within [from, until],
// the time from its start to the next end of another request of any of
// loads that was served.
func nextEnds(calm *tenantLoad, loads []*tenantLoad, from, until time.Time) []calmWait {
	var ends, firsts []time.Time
	for _, l := range loads {
		l.mu.Lock()
		for _, r := range l.result {
			if r.servedWithin(time.Time{}, time.Time{}) { // a refusal ran nowhere
				ends = append(ends, r.end)
				firsts = append(firsts, r.end.Add(r.TTFT-r.E2E))
			}
		}
		l.mu.Unlock()
	}
	slices.SortFunc(ends, func(a, b time.Time) int { return a.Compare(b) })
	slices.SortFunc(firsts, func(a, b time.Time) int { return a.Compare(b) })
	// firstsIn counts the first tokens strictly inside (a, b).
	firstsIn := func(a, b time.Time) int {
		i, _ := slices.BinarySearchFunc(firsts, a, func(e, t time.Time) int {
			if e.After(t) {
				return 1
			}
			return -1
		})
		j, _ := slices.BinarySearchFunc(firsts, b, func(e, t time.Time) int {
			if e.Before(t) {
				return -1
			}
			return 1
		})
		return max(0, j-i)
	}
	calm.mu.Lock()
	defer calm.mu.Unlock()
	var out []calmWait
	for _, r := range calm.result {
		if !r.servedWithin(from, until) {
			continue
		}
		start := r.end.Add(-r.E2E)
		// The first end after start that is not r's own.
		i, _ := slices.BinarySearchFunc(ends, start, func(e, t time.Time) int {
			if e.After(t) {
				return 1
			}
			return -1
		})
		for ; i < len(ends); i++ {
			if !ends[i].Equal(r.end) {
				out = append(out, calmWait{ms(start.Sub(from)), ms(r.TTFT), ms(ends[i].Sub(start)), firstsIn(start, start.Add(r.TTFT))})
				break
			}
		}
	}
	return out
}

// writeRequestsCSV writes every served request of loads (gzipped): its
// tenant, and its start, first token and end in ms from "from", for
// reading a run's tail after the fact.
func writeRequestsCSV(path string, loads []*tenantLoad, from time.Time) error {
	var b strings.Builder
	b.WriteString("tenant,start_ms,first_token_ms,end_ms\n")
	for _, l := range loads {
		l.mu.Lock()
		for _, r := range l.result {
			if r.servedWithin(time.Time{}, time.Time{}) {
				start := r.end.Add(-r.E2E)
				fmt.Fprintf(&b, "%s,%.1f,%.1f,%.1f\n", l.plan.name, ms(start.Sub(from)), ms(start.Add(r.TTFT).Sub(from)), ms(r.end.Sub(from)))
			}
		}
		l.mu.Unlock()
	}
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	if _, err := zw.Write([]byte(b.String())); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return writeResultFile(path, z.Bytes())
}

// promptTokensBetween sums the prompt and cached tokens of the requests
// served that ended within [from, until].
func (l *tenantLoad) promptTokensBetween(from, until time.Time) (prompt, cached int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.result {
		if !r.servedWithin(from, until) {
			continue
		}
		prompt += r.PromptTokens
		cached += r.CachedTokens
	}
	return prompt, cached
}

// counted reports whether r ended inside l's window, the requests its
// figures count.
func (l *tenantLoad) counted(r timedResult) bool {
	return !r.end.Before(l.from) && (l.until.IsZero() || !r.end.After(l.until))
}

// servedTTFTsMs returns the TTFTs (ms) its figures' percentiles are taken
// over, in the order the requests ended.
func (l *tenantLoad) servedTTFTsMs() []float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []float64
	for _, r := range l.result {
		if l.counted(r) && r.Err == nil && r.Status == http.StatusOK {
			out = append(out, ms(r.TTFT))
		}
	}
	return out
}

func (l *tenantLoad) figures(window time.Duration) TenantFigures {
	l.mu.Lock()
	defer l.mu.Unlock()
	var f TenantFigures
	var ttft []float64
	for _, r := range l.result {
		if !l.counted(r) {
			continue
		}
		f.Requests++
		switch {
		case r.Status == http.StatusTooManyRequests:
			f.Refused++
			continue
		case r.Err != nil || r.Status != http.StatusOK:
			f.Errors++
			continue
		}
		ttft = append(ttft, ms(r.TTFT))
		f.PromptTokens += r.PromptTokens
		f.CachedTokens += r.CachedTokens
		f.CompletionTokens += r.CompletionTokens
	}
	f.Tokens = f.PromptTokens + f.CompletionTokens
	if len(ttft) > 0 {
		f.TTFTP50Ms, f.TTFTP90Ms, f.TTFTP99Ms = Percentile(ttft, 50), Percentile(ttft, 90), Percentile(ttft, 99)
	}
	f.ReqPerS = float64(f.Requests-f.Refused-f.Errors) / window.Seconds()
	return f
}

// FormatOverload renders the runs as Markdown tables.
func FormatOverload(r *OverloadResult) string {
	var b strings.Builder
	c := r.Config
	fmt.Fprintf(&b, "# Overload: a calm tenant under a flood\n\n%d replicas (cart-sim, --max-num-seqs %d, %d ±%.0f%% output tokens at %g ms/token, decode slowdown %g per other sequence), calm tenant %.1f streamed chats/s, flood %d in flight; windows of %s after a %s head start; headroom (priority, shed) %d slot(s) per worker; seed %d. \n\n%s\n",
		c.Replicas, c.Seqs, c.OutputTokens, 100*c.OutputSpread, c.DecodeMsPerToken, c.DecodeSlowdown, c.CalmRate, c.FloodConcurrency, c.Measure, c.Warmup, c.ReserveSlots, c.Seed, MachineMarkdown(r.Machine))
	for _, sc := range c.Scenarios {
		var runs []OverloadRun
		for _, run := range r.Runs {
			if run.Scenario == sc {
				runs = append(runs, run)
			}
		}
		if len(runs) == 0 {
			continue
		}
		fmt.Fprintf(&b, "## %s\n\n| through | calm TTFT p50 / p99 alone (ms) | calm TTFT p50 / p90 / p99 under the flood (ms) | p99 flood / alone | next end after a calm start p50 / p90 / p99 (ms) | calm errors / 429 | flood req/s | flood 429 | tokens/s | hit ratio: window / its second half | engine queues: waited / admitted (longest ≤ ms) | shares |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n", sc)
		for _, run := range runs {
			if run.Status != "ok" {
				fmt.Fprintf(&b, "| %s | %s: %s |||||||||||\n", run.Target, run.Status, run.Reason)
				continue
			}
			calm := run.Loaded["calm"]
			var floodRate float64
			floodRefused := 0
			var names []string
			for name, f := range run.Loaded {
				if name != "calm" {
					floodRate += f.ReqPerS
					floodRefused += f.Refused
					names = append(names, name)
				}
			}
			slices.Sort(names)
			var shares []string
			for _, n := range names {
				if v, ok := run.Shares[n]; ok {
					shares = append(shares, fmt.Sprintf("%s %.0f%%", n, 100*v))
				}
			}
			engine := "n/a"
			if e := run.Engine; e.Admitted > 0 {
				longest := "∞"
				if e.WaitMaxMs >= 0 {
					longest = fmt.Sprintf("%.0f", e.WaitMaxMs)
				}
				engine = fmt.Sprintf("%.0f / %.0f (%s)", e.Waited, e.Admitted, longest)
			}
			fmt.Fprintf(&b, "| %s | %.0f / %.0f | %.0f / %.0f / %.0f | **%.1f×** | %.0f / %.0f / %.0f | %d / %d | %.1f | %d | %.0f | %.4f / %.4f | %s | %s |\n",
				run.Target, run.Alone.TTFTP50Ms, run.Alone.TTFTP99Ms, calm.TTFTP50Ms, calm.TTFTP90Ms, calm.TTFTP99Ms,
				nanTo0(run.CalmP99Ratio), run.NextEndP50Ms, run.NextEndP90Ms, run.NextEndP99Ms, calm.Errors+run.Alone.Errors, calm.Refused, floodRate, floodRefused, run.TokensPerS, run.HitRatio, run.HitRatioLate, engine, strings.Join(shares, ", "))
		}
		b.WriteString("\n")
	}
	return b.String()
}

func nanTo0(f float64) float64 {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0
	}
	return f
}

// ReadOverload reads a results.json written by RunOverload.
func ReadOverload(path string) (*OverloadResult, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r OverloadResult
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, errors.Join(fmt.Errorf("read %s", path), err)
	}
	return &r, nil
}
