package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cartrouter/cart/sim"
)

// Scenario names, in the order the suite runs them.
const (
	ScenarioNginxRR    = "nginx-rr"
	ScenarioNginxLC    = "nginx-lc"
	ScenarioCart       = "cart"
	ScenarioDistPrefix = "cart-dist-" // + number of data planes
	ScenarioSplit      = "split-4"
)

// isVariant reports whether sc names an all-in-one routing-quality variant
// ("cart-plain", "cart-all", ...).
func isVariant(sc string) bool {
	name, ok := strings.CutPrefix(sc, ScenarioCart+"-")
	if !ok || strings.HasPrefix(sc, ScenarioDistPrefix) {
		return false
	}
	_, known := CartVariants[name]
	return known && name != ""
}

// AllScenarios lists every scenario the suite knows.
var AllScenarios = []string{ScenarioNginxRR, ScenarioNginxLC, ScenarioCart,
	ScenarioDistPrefix + "1", ScenarioDistPrefix + "2", ScenarioDistPrefix + "4", ScenarioSplit}

// InstallHint says how to get the external proxies.
const InstallHint = "apt-get install -y nginx haproxy"

// SimConfig is the simulated replicas' model.
type SimConfig struct {
	BlockTokens       int     `json:"block_tokens"`
	PrefillUsPerToken float64 `json:"prefill_us_per_token"`
	DecodeMsPerToken  float64 `json:"decode_ms_per_token"`
	DecodeSlowdown    float64 `json:"decode_slowdown"`
	MaxConcurrency    int     `json:"max_concurrency"`
	TimeScale         float64 `json:"time_scale"`
	// MaxRunning and SchedulingPolicy are the engine's batch limit and
	// queue order (cart-sim --max-num-seqs, --scheduling-policy); 0 and ""
	// leave them unset (no batch limit).
	MaxRunning       int    `json:"max_running,omitempty"`
	SchedulingPolicy string `json:"scheduling_policy,omitempty"`
	OutputTokens     int    `json:"output_tokens,omitempty"`
}

// TraceProfile is how the suite slices and paces one trace, and the cache
// size of the pool it is replayed on.
type TraceProfile struct {
	// Limit is the number of requests in the slice (0 = whole trace).
	Limit int `json:"limit"`
	// Speedup divides trace timestamps.
	Speedup float64 `json:"speedup"`
	// Rate, when > 0, replaces the timestamps of a trace whose requests all
	// arrive at t=0 with Poisson arrivals at this many requests/s.
	Rate float64 `json:"rate"`
	// CacheTokens is each replica's cache capacity (0 = unbounded).
	CacheTokens int `json:"cache_tokens"`
}

// DefaultProfiles size each shipped trace so that its slice runs for about
// half a minute per scenario and the cache capacity matters:
//   - sglang_gsp: 512 of the 1,024 requests (oracle 82%), Poisson at 40
//     req/s; 40,960 tokens a replica, so one replica holds a quarter of the
//     64 shared prefixes: routing by prefix fits, round robin thrashes.
//   - mooncake_conversation: 800 requests (4.5 min of trace, oracle 17% of
//     a 4M-token pool; conversation reuse needs long windows), 8x speed-up,
//     1M tokens a replica.
//   - llmd_shared_prefix: 600 requests, 2x speed-up, 307,200 tokens a
//     replica (the prefixes need 73% of the pool, as in the llm-d test).
func DefaultProfiles() map[string]TraceProfile {
	return map[string]TraceProfile{
		"sglang_gsp_default_blk512":       {Limit: 512, Speedup: 1, Rate: 40, CacheTokens: 40960},
		"mooncake_conversation":           {Limit: 800, Speedup: 8, CacheTokens: 1 << 20},
		"llmd_shared_prefix_73pct_blk512": {Limit: 600, Speedup: 2, CacheTokens: 307200},
	}
}

// defaultProfile applies to traces without a profile.
var defaultProfile = TraceProfile{Limit: 200, Speedup: 1, Rate: 10, CacheTokens: 1 << 20}

// SuiteConfig describes one suite: for each trace, one slice replayed
// against every scenario on one simulated pool.
type SuiteConfig struct {
	RepoRoot  string   `json:"-"`
	BinDir    string   `json:"bin_dir"`
	TraceDir  string   `json:"trace_dir"`
	Traces    []string `json:"traces"`
	Scenarios []string `json:"scenarios"`
	OutDir    string   `json:"out_dir"`
	// Full replays whole traces (BENCH_FULL=1).
	Full  bool `json:"full"`
	Start int  `json:"start"`
	// Profiles per trace name; Limit, Speedup, Rate and CacheTokens below
	// override every profile when >= 0 (CacheTokens) or > 0 (others).
	Profiles     map[string]TraceProfile `json:"profiles"`
	Limit        int                     `json:"limit_override"`
	Speedup      float64                 `json:"speedup_override"`
	ZeroTimeRate float64                 `json:"rate_override"`
	CacheTokens  int                     `json:"cache_tokens_override"`
	MaxTokensCap int                     `json:"max_tokens_cap"`
	Replicas     int                     `json:"replicas"`
	// Sim is the replicas' model; its CacheTokens comes from the profile.
	Sim         SimConfig `json:"sim"`
	Concurrency int       `json:"concurrency"`
	// RunTimeout bounds each scenario's run; StartTimeout each role's start.
	RunTimeout     time.Duration  `json:"run_timeout_ns"`
	StartTimeout   time.Duration  `json:"start_timeout_ns"`
	RecordRequests bool           `json:"record_requests"`
	SkipOverhead   bool           `json:"skip_overhead"`
	Overhead       OverheadConfig `json:"overhead"`
	// SkipControlPlane leaves out the control-plane section, SkipFailover
	// the failover section.
	SkipControlPlane bool           `json:"skip_controlplane"`
	CP               CPConfig       `json:"controlplane"`
	SkipFailover     bool           `json:"skip_failover"`
	Failover         FailoverConfig `json:"failover"`
}

// Profile returns the effective profile of a trace.
func (c SuiteConfig) Profile(trace string) TraceProfile {
	p, ok := c.Profiles[trace]
	if !ok {
		p = defaultProfile
	}
	if c.Limit > 0 {
		p.Limit = c.Limit
	}
	if c.Speedup > 0 {
		p.Speedup = c.Speedup
	}
	if c.ZeroTimeRate > 0 {
		p.Rate = c.ZeroTimeRate
	}
	if c.CacheTokens >= 0 {
		p.CacheTokens = c.CacheTokens
	}
	if c.Full {
		p.Limit = 0
	}
	return p
}

// DefaultSuiteConfig is sized so the default suite (two trace slices, seven
// scenarios each, plus the overhead benchmark) takes about a quarter of an
// hour on a 2-core machine.
func DefaultSuiteConfig(repoRoot string) SuiteConfig {
	return SuiteConfig{
		RepoRoot:     repoRoot,
		BinDir:       filepath.Join(repoRoot, "bin"),
		TraceDir:     filepath.Join(repoRoot, "..", "shared", "traces"),
		Traces:       []string{"sglang_gsp_default_blk512", "mooncake_conversation"},
		Scenarios:    append([]string(nil), AllScenarios...),
		Profiles:     DefaultProfiles(),
		CacheTokens:  -1,
		MaxTokensCap: 64,
		Replicas:     4,
		Sim: SimConfig{
			BlockTokens: 16, PrefillUsPerToken: 50, DecodeMsPerToken: 5,
			DecodeSlowdown: 0.05, MaxConcurrency: 1, TimeScale: 0.25,
		},
		Concurrency:  512,
		RunTimeout:   150 * time.Second,
		StartTimeout: 20 * time.Second,
		Overhead:     DefaultOverhead(),
		CP:           DefaultCPConfig(),
		Failover:     DefaultFailoverConfig(),
	}
}

// ScenarioResult is one scenario's outcome on one trace.
type ScenarioResult struct {
	Trace    string `json:"trace"`
	Scenario string `json:"scenario"`
	// Status is ok, skipped (a role could not start or a tool is missing)
	// or failed (the run itself went wrong).
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
	// DataPlanes is the number of routers behind HAProxy (0 otherwise).
	DataPlanes int      `json:"dataplanes,omitempty"`
	Summary    *Summary `json:"summary,omitempty"`
	// ReplicaHitRatio is the hit ratio the replicas counted themselves
	// (GET /sim/stats), a cross-check of the client-side figure.
	ReplicaHitRatio float64             `json:"replica_hit_ratio"`
	ReplicaStats    map[string]SimStats `json:"replica_stats,omitempty"`
	// RouterMetrics sums selected CART counters (routing decisions,
	// fallbacks, retries) over the scenario's routers.
	RouterMetrics map[string]float64 `json:"router_metrics,omitempty"`
	RunFile       string             `json:"run_file,omitempty"`
	WallS         float64            `json:"wall_s"`
}

// SimStats is GET /sim/stats, decoded into the simulator's own type so
// that a counter added there reaches the report.
type SimStats = sim.Stats

// SuiteResults is results.json.
type SuiteResults struct {
	StartedAt  time.Time        `json:"started_at"`
	FinishedAt time.Time        `json:"finished_at"`
	Config     SuiteConfig      `json:"config"`
	Machine    MachineInfo      `json:"machine"`
	Slices     []SliceInfo      `json:"slices"`
	Scenarios  []ScenarioResult `json:"scenarios"`
	Overhead   *OverheadResult  `json:"overhead,omitempty"`
	// ControlPlane and Failover are the control-plane sections.
	ControlPlane *CPResult       `json:"controlplane,omitempty"`
	Failover     *FailoverResult `json:"failover,omitempty"`
	Notes        []string        `json:"notes,omitempty"`
}

// SliceInfo describes the requests one trace contributed.
type SliceInfo struct {
	Trace    string  `json:"trace"`
	Path     string  `json:"path"`
	Start    int     `json:"start"`
	Requests int     `json:"requests"`
	SpanS    float64 `json:"span_s"`
	Arrivals string  `json:"arrivals"`
	Speedup  float64 `json:"speedup"`
	Rate     float64 `json:"rate,omitempty"`
	// CacheTokens is each replica's cache capacity for this trace.
	CacheTokens int `json:"cache_tokens"`
}

type replica struct {
	name string
	port int
	// kvPort and replayPort publish the replica's KV events (0: off).
	kvPort, replayPort int
	proc               *Proc
	// role is the replica's prefill/decode role (cart-sim --pd-role).
	role string
}

type suite struct {
	env      *Env
	cfg      SuiteConfig
	replicas []*replica
	nginx    string // path, "" if missing
	caddy    string // path, "" if missing (the overhead benchmark only)
	// cacheTokens is the current trace's per-replica cache capacity.
	cacheTokens int
	haproxy     string
	cartBin     string
	simBin      string
	// extra is YAML added to every cart config this suite writes
	// (CartRouterConfig.Extra): the overload benchmark's keys and flow.
	extra string
	// extraSimArgs are cart-sim flags added to every replica's.
	extraSimArgs []string
}

// RunSuite runs every configured scenario on every configured trace and
// writes the results directory.
func RunSuite(ctx context.Context, cfg SuiteConfig, log io.Writer) error {
	started := time.Now()
	env, err := NewEnv(cfg, log)
	if err != nil {
		return err
	}
	defer env.Close()
	s := &suite{env: env, cfg: cfg,
		cartBin: filepath.Join(cfg.BinDir, "cart"), simBin: filepath.Join(cfg.BinDir, "cart-sim")}
	for _, b := range []string{s.cartBin, s.simBin} {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("%s not found: run `make build` first (%w)", b, err)
		}
	}
	res := &SuiteResults{StartedAt: started.UTC(), Config: cfg}
	if p, err := exec.LookPath("nginx"); err == nil {
		s.nginx = p
	} else {
		res.Notes = append(res.Notes, "nginx not found: nginx scenarios skipped ("+InstallHint+")")
	}
	if p, err := exec.LookPath("haproxy"); err == nil {
		s.haproxy = p
	} else {
		res.Notes = append(res.Notes, "haproxy not found: distributed and split scenarios skipped ("+InstallHint+")")
	}
	for _, n := range res.Notes {
		env.Logf("warning: %s", n)
	}
	res.Machine = CollectMachineInfo()
	if err := os.MkdirAll(filepath.Join(cfg.OutDir, "runs"), 0o755); err != nil {
		return err
	}
	for _, trace := range cfg.Traces {
		if ctx.Err() != nil {
			break
		}
		w, info, err := s.buildWorkload(trace)
		if err != nil {
			env.Logf("trace %s: %v", trace, err)
			res.Notes = append(res.Notes, fmt.Sprintf("trace %s skipped: %v", trace, err))
			continue
		}
		res.Slices = append(res.Slices, info)
		env.Logf("== trace %s: %d requests over %.1fs (%s), %d replicas with %s cache tokens each",
			trace, info.Requests, info.SpanS, info.Arrivals, max(cfg.Replicas, 1), tokensOrUnbounded(info.CacheTokens))
		s.stopReplicas()
		s.cacheTokens = info.CacheTokens
		if err := s.startReplicas(ctx); err != nil {
			return fmt.Errorf("starting replicas: %w", err)
		}
		for _, sc := range cfg.Scenarios {
			if ctx.Err() != nil {
				break
			}
			r := s.runScenario(ctx, trace, sc, w, info)
			res.Scenarios = append(res.Scenarios, r)
			if r.Status == "ok" {
				env.Logf("   %-12s hit %.1f%% (oracle %.1f%%) TTFT p50 %.0f ms p99 %.0f ms, %.2f req/s, %d errors, imbalance %.2f [%.0fs]",
					sc, 100*r.Summary.HitRatio, 100*r.Summary.OracleHitRatio, r.Summary.TTFTMs.P50, r.Summary.TTFTMs.P99,
					r.Summary.ReqPerS, r.Summary.Errors, r.Summary.Imbalance, r.WallS)
			} else {
				env.Logf("   %-12s %s: %s", sc, r.Status, r.Reason)
			}
		}
	}
	if !cfg.SkipOverhead && ctx.Err() == nil {
		env.Logf("== proxy overhead (%s per target, concurrency %d)", cfg.Overhead.Duration, cfg.Overhead.Concurrency)
		o := RunOverhead(ctx, env, cfg.Overhead)
		res.Overhead = &o
		for _, t := range o.Targets {
			if t.Skipped != "" {
				env.Logf("   %-8s skipped: %s", t.Name, t.Skipped)
			} else {
				env.Logf("   %-8s %.0f req/s, p50 %.2f ms, p99 %.2f ms, %d errors", t.Name, t.ReqPerS, t.P50Ms, t.P99Ms, t.Errors)
			}
		}
	}
	if !cfg.SkipControlPlane && ctx.Err() == nil {
		env.Logf("== control plane (%d nodes, %s per run)", cfg.CP.Nodes, cfg.CP.Duration)
		cp := RunCP(ctx, env, cfg.CP)
		res.ControlPlane = &cp
		if cp.Skipped != "" {
			env.Logf("   skipped: %s", cp.Skipped)
		}
	}
	if !cfg.SkipFailover && ctx.Err() == nil {
		env.Logf("== failover (leader kill, %s windows)", cfg.Failover.Window)
		fo := RunFailover(ctx, env, cfg.Failover)
		res.Failover = &fo
		if fo.Skipped != "" {
			env.Logf("   skipped: %s", fo.Skipped)
		}
	}
	res.FinishedAt = time.Now().UTC()
	res.Machine.LoadAvgEnd = LoadAvg()
	if err := WriteReport(cfg.OutDir, res); err != nil {
		return err
	}
	env.Logf("wrote %s (%.1f min)", cfg.OutDir, time.Since(started).Minutes())
	if ctx.Err() != nil {
		return ctx.Err()
	}
	for _, r := range res.Scenarios {
		if r.Status == "ok" {
			return nil
		}
	}
	return errors.New("no scenario ran")
}

// buildWorkload loads one trace slice.
func (s *suite) buildWorkload(trace string) (*Workload, SliceInfo, error) {
	path := trace
	if !strings.ContainsRune(trace, '/') {
		path = filepath.Join(s.cfg.TraceDir, trace)
		if filepath.Ext(path) == "" {
			path += ".jsonl"
		}
	}
	recs, err := LoadTrace(path)
	if err != nil {
		return nil, SliceInfo{}, err
	}
	prof := s.cfg.Profile(trimExt(filepath.Base(path)))
	recs = SliceTrace(recs, s.cfg.Start, prof.Limit)
	if len(recs) == 0 {
		return nil, SliceInfo{}, fmt.Errorf("start %d is past the end", s.cfg.Start)
	}
	opts := TraceOptions{Speedup: prof.Speedup, MaxTokensCap: s.cfg.MaxTokensCap, Seed: 1}
	arrivals := fmt.Sprintf("trace timestamps / %g", prof.Speedup)
	if recs[len(recs)-1].Timestamp == 0 && prof.Rate > 0 {
		opts.Rate = prof.Rate
		arrivals = fmt.Sprintf("all at t=0 in the trace: Poisson at %g req/s", prof.Rate)
	}
	w := TraceWorkload(trimExt(filepath.Base(path)), recs, opts)
	span := 0.0
	if n := len(w.Requests); n > 0 {
		span = w.Requests[n-1].At.Seconds()
	}
	return w, SliceInfo{Trace: trace, Path: path, Start: s.cfg.Start, Requests: len(recs), SpanS: span, Arrivals: arrivals,
		Speedup: opts.Speedup, Rate: opts.Rate, CacheTokens: prof.CacheTokens}, nil
}

func (s *suite) replicaNames() []string {
	out := make([]string, len(s.replicas))
	for i, r := range s.replicas {
		out[i] = r.name
	}
	return out
}

func (s *suite) replicaURLs() []string {
	out := make([]string, len(s.replicas))
	for i, r := range s.replicas {
		out[i] = baseURL(r.port)
	}
	return out
}

func (s *suite) replicaAddrs() []string {
	out := make([]string, len(s.replicas))
	for i, r := range s.replicas {
		out[i] = hostPort(r.port)
	}
	return out
}

func (s *suite) simArgs(r *replica) []string {
	c := s.cfg.Sim
	args := []string{
		"--listen", hostPort(r.port), "--name", r.name,
		"--cache-tokens", strconv.Itoa(s.cacheTokens), "--block-tokens", strconv.Itoa(c.BlockTokens),
		"--prefill-us-per-token", fmt.Sprint(c.PrefillUsPerToken), "--decode-ms-per-token", fmt.Sprint(c.DecodeMsPerToken),
		"--decode-slowdown", fmt.Sprint(c.DecodeSlowdown), "--max-concurrency", strconv.Itoa(c.MaxConcurrency),
		"--time-scale", fmt.Sprint(c.TimeScale),
	}
	if c.MaxRunning > 0 {
		args = append(args, "--max-num-seqs", strconv.Itoa(c.MaxRunning))
	}
	if c.SchedulingPolicy != "" {
		args = append(args, "--scheduling-policy", c.SchedulingPolicy)
	}
	if c.OutputTokens > 0 {
		args = append(args, "--output-tokens", strconv.Itoa(c.OutputTokens))
	}
	if r.kvPort > 0 {
		args = append(args, "--kv-events-endpoint", "tcp://"+hostPort(r.kvPort), "--kv-events-replay-endpoint", "tcp://"+hostPort(r.replayPort))
	}
	if r.role != "" {
		args = append(args, "--pd-role", r.role)
	}
	return append(args, s.extraSimArgs...)
}

// wantsEvents reports whether a scenario consumes KV events: only then do
// the replicas publish them, so the other scenarios run as before.
func (s *suite) wantsEvents() bool {
	for _, sc := range s.cfg.Scenarios {
		if name, ok := strings.CutPrefix(sc, ScenarioCart+"-"); ok && CartVariants[name].Events {
			return true
		}
	}
	return false
}

// kvEndpoints lists the replicas' KV event and replay endpoints.
func (s *suite) kvEndpoints() (pub, replay []string) {
	for _, r := range s.replicas {
		pub = append(pub, "tcp://"+hostPort(r.kvPort))
		replay = append(replay, "tcp://"+hostPort(r.replayPort))
	}
	return pub, replay
}

// syncKVEvents makes every replica's event stream start from a known state
// for the router under test: it resets the (idle) replicas, whose cache
// clear the router must see, until the router reports every worker synced.
func (s *suite) syncKVEvents(ctx context.Context, port int) error {
	var missing []string
	for range 10 {
		for _, r := range s.replicas {
			_, _, _ = s.env.Post(baseURL(r.port)+"/sim/reset", "{}")
		}
		err := s.env.WaitReady(ctx, nil, 2*time.Second, func() error {
			_, body, err := s.env.Get(baseURL(port) + "/metrics")
			if err != nil {
				return err
			}
			got := ParseCounters(string(body), []string{"cart_kv_event_synced"})
			missing = missing[:0]
			for _, u := range s.replicaURLs() {
				if got[`cart_kv_event_synced{worker="`+u+`"}`] != 1 {
					missing = append(missing, u)
				}
			}
			if len(missing) > 0 {
				return fmt.Errorf("kv events not synced for %v", missing)
			}
			return nil
		})
		if err == nil {
			return nil
		}
	}
	return fmt.Errorf("kv events never synced for %v", missing)
}

func (s *suite) startReplica(ctx context.Context, r *replica) error {
	p, err := s.env.Start(r.name, s.simBin, s.simArgs(r)...)
	if err != nil {
		return err
	}
	r.proc = p
	return s.env.WaitReady(ctx, p, s.cfg.StartTimeout, s.env.httpOK(baseURL(r.port)+"/health"))
}

func (s *suite) stopReplicas() {
	var ps []*Proc
	for _, r := range s.replicas {
		if r.proc != nil {
			ps = append(ps, r.proc)
		}
	}
	s.env.StopAll(ps)
	s.replicas = nil
}

func (s *suite) startReplicas(ctx context.Context) error {
	for i := range max(s.cfg.Replicas, 1) {
		port, err := s.env.FreePort()
		if err != nil {
			return err
		}
		r := &replica{name: fmt.Sprintf("sim-%d", i+1), port: port}
		if s.wantsEvents() {
			if r.kvPort, err = s.env.FreePort(); err != nil {
				return err
			}
			if r.replayPort, err = s.env.FreePort(); err != nil {
				return err
			}
		}
		s.replicas = append(s.replicas, r)
		if err := s.startReplica(ctx, r); err != nil {
			return err
		}
	}
	return nil
}

// resetReplicas waits for the replicas to go idle and empties their caches
// and counters, restarting any that does not answer.
func (s *suite) resetReplicas(ctx context.Context) error {
	for _, r := range s.replicas {
		url := baseURL(r.port)
		_ = s.env.WaitReady(ctx, nil, 15*time.Second, func() error {
			st, err := s.simStats(r)
			if err != nil {
				return err
			}
			if st.Running+st.Queued > 0 {
				return fmt.Errorf("%d running, %d queued", st.Running, st.Queued)
			}
			return nil
		})
		code, _, err := s.env.Post(url+"/sim/reset", "{}")
		if err == nil && code == 200 {
			continue
		}
		s.env.Logf("   replica %s did not reset (%v, %d): restarting it", r.name, err, code)
		if r.proc != nil {
			s.env.StopAll([]*Proc{r.proc})
		}
		if err := s.startReplica(ctx, r); err != nil {
			return err
		}
	}
	return nil
}

func (s *suite) simStats(r *replica) (SimStats, error) {
	var st SimStats
	code, body, err := s.env.Get(baseURL(r.port) + "/sim/stats")
	if err != nil {
		return st, err
	}
	if code != 200 {
		return st, fmt.Errorf("/sim/stats: %d", code)
	}
	return st, json.Unmarshal(body, &st)
}

// runScenario sets a scenario up, replays the workload and tears it down.
func (s *suite) runScenario(ctx context.Context, trace, sc string, w *Workload, info SliceInfo) (r ScenarioResult) {
	began := time.Now()
	r = ScenarioResult{Trace: trace, Scenario: sc}
	defer func() { r.WallS = time.Since(began).Seconds() }()
	if err := s.resetReplicas(ctx); err != nil {
		r.Status, r.Reason = "failed", "resetting replicas: "+err.Error()
		return r
	}
	dep, err := s.setup(ctx, trace, sc)
	r.DataPlanes = dep.dataplanes
	if err != nil {
		s.env.StopAll(dep.procs)
		r.Status, r.Reason = "skipped", err.Error()
		s.keepLogs(dep.procs, "")
		return r
	}
	target := dep.target
	rc := DefaultRunConfig()
	rc.Target = target
	rc.Workload = "trace"
	rc.TracePath = info.Path
	rc.Start, rc.Limit, rc.Speedup, rc.Rate, rc.MaxTokensCap = s.cfg.Start, len(w.Requests), info.Speedup, info.Rate, s.cfg.MaxTokensCap
	rc.Concurrency, rc.RunTimeout = s.cfg.Concurrency, s.cfg.RunTimeout
	rc.RequestTimeout = min(rc.RequestTimeout, s.cfg.RunTimeout)
	rc.PoolCacheTokens = s.cacheTokens * len(s.replicas)
	rc.BlockTokens = s.cfg.Sim.BlockTokens
	rc.Replicas = s.replicaNames()
	rc.RecordRequests = s.cfg.RecordRequests
	run := ExecuteWorkload(ctx, rc, w, trace+" "+sc, s.env.Log)
	r.RouterMetrics = s.routerMetrics(dep.routers)
	s.env.StopAll(dep.procs)
	if dep.stop != nil {
		dep.stop()
	}

	r.Summary = &run.Summary
	r.ReplicaStats = map[string]SimStats{}
	var p, c int64
	for _, rep := range s.replicas {
		if st, err := s.simStats(rep); err == nil {
			r.ReplicaStats[rep.name] = st
			p += st.PromptTokens
			c += st.CachedTokens
		}
	}
	if p > 0 {
		r.ReplicaHitRatio = float64(c) / float64(p)
	}
	file := filepath.Join("runs", trace+"__"+sc+".json")
	if err := WriteJSON(filepath.Join(s.cfg.OutDir, file), run); err == nil {
		r.RunFile = file
	}
	r.Status = "ok"
	if run.Summary.Succeeded == 0 {
		r.Status = "failed"
		r.Reason = fmt.Sprintf("no request succeeded: %v", run.Summary.ErrorKinds)
	}
	return r
}

// keepLogs copies the logs of a skipped scenario's processes into
// <out>/logs/, since the suite's temporary directory is removed at the end;
// each file's name is the process's with prefix before it, so that runs
// reusing a process name (the overload scenarios) do not overwrite each
// other's.
func (s *suite) keepLogs(procs []*Proc, prefix string) {
	dir := filepath.Join(s.cfg.OutDir, "logs")
	for _, p := range procs {
		b, err := os.ReadFile(p.LogPath)
		if err != nil || len(b) == 0 {
			continue
		}
		if len(b) > 64<<10 {
			b = b[len(b)-64<<10:]
		}
		if os.MkdirAll(dir, 0o755) == nil {
			_ = os.WriteFile(filepath.Join(dir, prefix+filepath.Base(p.LogPath)), b, 0o644)
		}
	}
}

// deployment is a scenario's running router set-up.
type deployment struct {
	target     string // URL the load goes to
	stop       func() // in-process router to stop, if any
	procs      []*Proc
	dataplanes int
	routers    []int // ports of CART routers, for /metrics
}

// setup starts a scenario's router(s).
func (s *suite) setup(ctx context.Context, trace, sc string) (deployment, error) {
	var d deployment
	dir := s.env.Path(trace + "__" + sc)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return d, err
	}
	var err error
	switch {
	case sc == ScenarioNginxRR || sc == ScenarioNginxLC:
		d.target, d.procs, err = s.startNginx(ctx, dir, sc, s.replicaAddrs(), sc == ScenarioNginxLC)
	case sc == ScenarioPrecise:
		d.target, d.stop, err = s.startPrecise()
	case sc == ScenarioCart || isVariant(sc):
		port, perr := s.env.FreePort()
		if perr != nil {
			return d, perr
		}
		d.target, d.routers = baseURL(port), []int{port}
		d.procs, err = s.startCart(ctx, dir, sc, port, strings.TrimPrefix(strings.TrimPrefix(sc, ScenarioCart), "-"))
	case sc == ScenarioEPP || strings.HasPrefix(sc, ScenarioEPPDistPrefix):
		err = s.startEPPs(ctx, dir, sc, &d)
	case strings.HasPrefix(sc, ScenarioDistPrefix):
		n, aerr := strconv.Atoi(strings.TrimPrefix(sc, ScenarioDistPrefix))
		if aerr != nil || n < 1 || n > 16 {
			return d, fmt.Errorf("bad scenario %q: want %sN with N in 1..16", sc, ScenarioDistPrefix)
		}
		d.dataplanes = n
		err = s.startDistributed(ctx, dir, sc, n, &d)
	case sc == ScenarioSplit:
		d.dataplanes = 4
		err = s.startSplit(ctx, dir, sc, 4, &d)
	default:
		err = fmt.Errorf("unknown scenario %q (known: %s, %s, %sN)", sc, strings.Join(AllScenarios, ", "), ScenarioEPP, ScenarioEPPDistPrefix)
	}
	return d, err
}

// routerMetricNames are the CART counters kept per scenario.
var routerMetricNames = []string{"cart_routing_decisions_total", "cart_fallback_total", "cart_retries_total", "cart_kv_event_gaps_total", "cart_kv_event_publisher_restarts_total", "cart_kv_event_synced"}

// routerMetrics scrapes and sums the kept counters over the routers.
func (s *suite) routerMetrics(ports []int) map[string]float64 {
	if len(ports) == 0 {
		return nil
	}
	out := map[string]float64{}
	for _, page := range s.metricsPages(ports) {
		for k, v := range ParseCounters(page, routerMetricNames) {
			out[k] += v
		}
	}
	return out
}

// metricsPages fetches the routers' /metrics pages, leaving out those that
// did not answer 200.
func (s *suite) metricsPages(ports []int) []string {
	var pages []string
	for _, p := range ports {
		if code, body, err := s.env.Get(baseURL(p) + "/metrics"); err == nil && code == 200 {
			pages = append(pages, string(body))
		}
	}
	return pages
}

// ParseCounters returns the samples of the named metrics from Prometheus
// text exposition, keyed by "name{labels}".
func ParseCounters(text string, names []string) map[string]float64 {
	out := map[string]float64{}
	for _, line := range strings.Split(text, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		for _, n := range names {
			if !strings.HasPrefix(line, n) || (len(line) > len(n) && line[len(n)] != '{' && line[len(n)] != ' ') {
				continue
			}
			i := strings.LastIndexByte(line, ' ')
			if i < 0 {
				continue
			}
			v, err := strconv.ParseFloat(line[i+1:], 64)
			if err == nil {
				out[line[:i]] += v
			}
		}
	}
	return out
}

func (s *suite) startNginx(ctx context.Context, dir, name string, upstreams []string, leastConn bool) (string, []*Proc, error) {
	if s.nginx == "" {
		return "", nil, errors.New("nginx not found: " + InstallHint)
	}
	return s.startConfigured(ctx, name, filepath.Join(dir, "nginx.conf"), nil,
		func(port int) string { return NginxConfig(dir, port, upstreams, leastConn) },
		func(conf string) (string, []string) {
			return s.nginx, []string{"-e", filepath.Join(dir, "error.log"), "-c", conf, "-p", dir, "-g", "daemon off;"}
		},
		func(port int) func() error { return s.env.httpOK(baseURL(port) + "/health") })
}

// startCaddy runs Caddy as a reverse proxy to upstream (host:port), with
// its admin endpoint off and its state kept under dir.
func (s *suite) startCaddy(ctx context.Context, dir, name, upstream string) (string, []*Proc, error) {
	if s.caddy == "" {
		return "", nil, errors.New("caddy not found: apt-get install -y caddy")
	}
	home := filepath.Join(dir, "caddy-home")
	return s.startConfigured(ctx, name, filepath.Join(dir, "Caddyfile"),
		[]string{"HOME=" + home, "XDG_CONFIG_HOME=" + home, "XDG_DATA_HOME=" + home},
		func(port int) string { return CaddyConfig(port, upstream) },
		func(conf string) (string, []string) {
			return s.caddy, []string{"run", "--adapter", "caddyfile", "--config", conf}
		},
		func(port int) func() error { return s.env.httpOK(baseURL(port) + "/health") })
}

// startConfigured starts a third-party proxy on a free port: it writes
// render(port) to conf, starts the command cmd(conf) names with env added,
// and waits until ready(port) passes.
func (s *suite) startConfigured(ctx context.Context, name, conf string, env []string, render func(port int) string,
	cmd func(conf string) (string, []string), ready func(port int) func() error) (string, []*Proc, error) {
	port, err := s.env.FreePort()
	if err != nil {
		return "", nil, err
	}
	if err := os.WriteFile(conf, []byte(render(port)), 0o644); err != nil {
		return "", nil, err
	}
	bin, args := cmd(conf)
	p, err := s.env.StartEnv(name, bin, env, args...)
	if err != nil {
		return "", nil, err
	}
	return baseURL(port), []*Proc{p}, s.env.WaitReady(ctx, p, s.cfg.StartTimeout, ready(port))
}

// cartHealthy is a readiness check for a cart router: /health answers 200
// with every worker healthy.
func (s *suite) cartHealthy(port, workers int) func() error {
	return func() error {
		code, body, err := s.env.Get(baseURL(port) + "/health")
		if err != nil {
			return err
		}
		var h struct {
			Healthy int `json:"healthy_workers"`
			Workers int `json:"workers"`
		}
		_ = json.Unmarshal(body, &h)
		if code != 200 || h.Healthy < workers {
			return fmt.Errorf("/health %d: %s", code, strings.TrimSpace(string(body)))
		}
		return nil
	}
}

func (s *suite) startCart(ctx context.Context, dir, name string, port int, variant string) ([]*Proc, error) {
	c := CartRouterConfig{Port: port, Workers: s.replicaURLs(), CacheTokens: s.cacheTokens, Variant: variant}
	c.KVEvents, c.KVReplay = s.kvEndpoints()
	p, err := s.startRole(ctx, dir, name, "", c, s.cartHealthy(port, len(s.replicas)))
	if p == nil {
		return nil, err
	}
	if err == nil && CartVariants[variant].Events {
		err = s.syncKVEvents(ctx, port)
	}
	return []*Proc{p}, err
}

// startRole writes c as <dir>/<name>.yaml, starts `cart [role] -c` on it and
// waits until ready passes. The process is returned even when it does not
// become ready, so the caller can stop it and keep its log.
func (s *suite) startRole(ctx context.Context, dir, name, role string, c CartRouterConfig, ready func() error) (*Proc, error) {
	return s.startRoleEnv(ctx, dir, name, role, c, nil, ready)
}

// startRoleEnv is startRole with env added to the process's environment.
func (s *suite) startRoleEnv(ctx context.Context, dir, name, role string, c CartRouterConfig, env []string, ready func() error) (*Proc, error) {
	cfgPath := filepath.Join(dir, name+".yaml")
	if c.Extra == "" {
		c.Extra = s.extra
	}
	if err := os.WriteFile(cfgPath, []byte(CartConfig(c)), 0o644); err != nil {
		return nil, err
	}
	args := []string{"-c", cfgPath}
	if role != "" {
		args = append([]string{role}, args...)
	}
	p, err := s.env.StartEnv(name, s.cartBin, env, args...)
	if err != nil {
		return nil, err
	}
	return p, s.env.WaitReady(ctx, p, s.cfg.StartTimeout, ready)
}

func (s *suite) startHAProxy(ctx context.Context, dir, name string, backends []string) (string, *Proc, error) {
	url, ps, err := s.startConfigured(ctx, name+"-haproxy", filepath.Join(dir, "haproxy.cfg"), nil,
		func(port int) string { return HAProxyConfig(port, backends) },
		func(conf string) (string, []string) { return s.haproxy, []string{"-f", conf, "-db"} },
		tcpOpen)
	if len(ps) == 0 {
		return url, nil, err
	}
	return url, ps[0], err
}

// startSplit runs n independent all-in-one routers behind HAProxy: the
// baseline of scaling out without shared routing state.
func (s *suite) startSplit(ctx context.Context, dir, name string, n int, d *deployment) error {
	if s.haproxy == "" {
		return errors.New("haproxy not found: " + InstallHint)
	}
	var backends []string
	for i := range n {
		port, err := s.env.FreePort()
		if err != nil {
			return err
		}
		p, err := s.startCart(ctx, dir, fmt.Sprintf("%s-cart%d", name, i+1), port, "")
		d.procs = append(d.procs, p...)
		if err != nil {
			return err
		}
		backends = append(backends, hostPort(port))
		d.routers = append(d.routers, port)
	}
	return s.front(ctx, dir, name, backends, d)
}

// front puts HAProxy in front of the deployment's routers; d keeps the
// process even when it fails to become ready, so that it is stopped.
func (s *suite) front(ctx context.Context, dir, name string, backends []string, d *deployment) error {
	target, p, err := s.startHAProxy(ctx, dir, name, backends)
	if p != nil {
		d.procs = append(d.procs, p)
	}
	d.target = target
	return err
}

// startDistributed runs three control-plane nodes (GOMAXPROCS as the cp
// section's, --cp-node-procs) and n data planes behind HAProxy. Any role
// that fails to start skips the scenario with the reason.
func (s *suite) startDistributed(ctx context.Context, dir, name string, n int, d *deployment) error {
	if s.haproxy == "" {
		return errors.New("haproxy not found: " + InstallHint)
	}
	apiURLs, err := s.startControlPlanes(ctx, dir, name, d)
	if err != nil {
		return err
	}
	var backends []string
	for i := range n {
		port, err := s.env.FreePort()
		if err != nil {
			return err
		}
		id := fmt.Sprintf("dp%d", i+1)
		c := CartRouterConfig{Port: port, Workers: s.replicaURLs(), CacheTokens: s.cacheTokens,
			ControlPlanes: apiURLs, DataPlaneID: id}
		p, err := s.startRole(ctx, dir, name+"-"+id, "dataplane", c, s.cartHealthy(port, len(s.replicas)))
		if p != nil {
			d.procs = append(d.procs, p)
		}
		if err != nil {
			return fmt.Errorf("data plane %s: %w", id, err)
		}
		backends = append(backends, hostPort(port))
		d.routers = append(d.routers, port)
	}
	return s.front(ctx, dir, name, backends, d)
}

// startControlPlanes runs three control-plane nodes (GOMAXPROCS as the cp
// section's, --cp-node-procs) and returns their API URLs once they form a
// cluster with a leader.
func (s *suite) startControlPlanes(ctx context.Context, dir, name string, d *deployment) ([]string, error) {
	var apiURLs []string
	for i := range 3 {
		api, err1 := s.env.FreePort()
		raft, err2 := s.env.FreePort()
		if err := errors.Join(err1, err2); err != nil {
			return nil, err
		}
		node := fmt.Sprintf("cp%d", i+1)
		c := CartRouterConfig{Workers: s.replicaURLs(), CacheTokens: s.cacheTokens,
			NodeID: node, APIAddr: hostPort(api), RaftAddr: hostPort(raft), DataDir: filepath.Join(dir, node)}
		if i == 0 {
			c.Bootstrap = true
		} else {
			c.Join = []string{apiURLs[0]}
		}
		p, err := s.startRoleEnv(ctx, dir, name+"-"+node, "controlplane", c, procsEnv(s.cfg.CP.NodeProcs), tcpOpen(api))
		if p != nil {
			d.procs = append(d.procs, p)
		}
		if err != nil {
			return nil, fmt.Errorf("control plane %s: %w", node, err)
		}
		apiURLs = append(apiURLs, baseURL(api))
	}
	if err := s.env.WaitReady(ctx, d.procs[0], s.cfg.StartTimeout, s.clusterReady(apiURLs[0], 3)); err != nil {
		return nil, fmt.Errorf("control-plane cluster: %w", err)
	}
	return apiURLs, nil
}

// clusterReady asks a control-plane node for its cluster status (Connect
// JSON) and succeeds once there is a leader and members nodes.
func (s *suite) clusterReady(api string, members int) func() error {
	return func() error {
		code, body, err := s.env.Post(api+"/cart.v1.AdminService/ClusterStatus", "{}")
		if err != nil {
			return err
		}
		if code != 200 {
			return fmt.Errorf("ClusterStatus: %d %s", code, strings.TrimSpace(string(body)))
		}
		var st struct {
			LeaderID string            `json:"leaderId"`
			Members  []json.RawMessage `json:"members"`
		}
		if err := json.Unmarshal(body, &st); err != nil {
			return fmt.Errorf("ClusterStatus: %w", err)
		}
		if st.LeaderID == "" || len(st.Members) < members {
			return fmt.Errorf("ClusterStatus: leader %q, %d members", st.LeaderID, len(st.Members))
		}
		return nil
	}
}
