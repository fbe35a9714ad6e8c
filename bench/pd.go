package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cartrouter/cart/sim"
)

// The prefill/decode benchmark: the same four cart-sim replicas, split
// (two prefill, two decode, vLLM's NIXL protocol with a modelled KV
// transfer) or whole, behind CART, on the shared traces. Targets:
//   - cart-pd: the split pool, CART choosing the prefill worker by prefix
//     and the decode worker by load;
//   - blind-pd: the split pool, CART with prefix matching off
//     (cache.threshold 1, match_abs_threshold 0: only a prompt cached whole
//     counts, which a conversation's next turn never is), so the prefill
//     worker is the least loaded with random ties, as a round-robin
//     proxy's choice is, while everything else (decode choice, the legs)
//     stays CART's;
//   - cart-agg: the four replicas whole, CART as usual.
//
// The hit ratio is counted where prompts are computed: by the prefill
// replicas of a split pool (a decode replica pulls its prompt), by all four
// of a whole one (GET /sim/stats). TTFT is the client's (first streamed
// token), so a split request's includes its prefill leg and the transfer.

// PDTargets are the benchmark's targets, in the order it runs them.
var PDTargets = []string{"cart-pd", "blind-pd", "cart-agg"}

// PDConfig sizes the benchmark.
type PDConfig struct {
	Traces  []string `json:"traces"`
	Targets []string `json:"targets"`
	// KVTransferUsPerToken is the decode replicas' pull time per token
	// (cart-sim --kv-transfer-us-per-token, scaled like every delay).
	KVTransferUsPerToken float64 `json:"kv_transfer_us_per_token"`
	// Prefill and Decode are the split pool's replicas by role; the whole
	// pool has as many replicas as both together.
	Prefill int `json:"prefill"`
	Decode  int `json:"decode"`
}

// DefaultPD replays the suite's slices of two shared traces.
func DefaultPD() PDConfig {
	return PDConfig{Traces: []string{"sglang_gsp_default_blk512", "mooncake_conversation"},
		Targets: append([]string(nil), PDTargets...), KVTransferUsPerToken: sim.DefaultKVTransferUsPerToken, Prefill: 2, Decode: 2}
}

// PDRun is one trace through one target.
type PDRun struct {
	Trace  string   `json:"trace"`
	Target string   `json:"target"`
	Status string   `json:"status"`
	Reason string   `json:"reason,omitempty"`
	Roles  []string `json:"roles"` // of the replicas
	// Summary is the client's side; its hit ratio is what the answers
	// reported (a decode replica reports its pulled prompt as cached).
	Summary *Summary `json:"summary,omitempty"`
	// ComputeHitRatio is cached / prompt tokens over the replicas that
	// computed prompts (prefill replicas, or all of a whole pool), and
	// Oracle the ratio of one LRU cache as large as theirs together over
	// the same requests (the ceiling).
	ComputeHitRatio float64             `json:"compute_hit_ratio"`
	Oracle          float64             `json:"oracle"`
	Replicas        map[string]SimStats `json:"replicas,omitempty"`
	// LegMeanMs are CART's cart_pd_leg_seconds means, by leg.
	LegMeanMs     map[string]float64 `json:"leg_mean_ms,omitempty"`
	RouterMetrics map[string]float64 `json:"router_metrics,omitempty"`
	WallS         float64            `json:"wall_s"`
}

// PDResult is results.json of the benchmark.
type PDResult struct {
	StartedAt time.Time   `json:"started_at"`
	Config    PDConfig    `json:"config"`
	Suite     SuiteConfig `json:"suite"`
	Slices    []SliceInfo `json:"slices"`
	Machine   MachineInfo `json:"machine"`
	Runs      []PDRun     `json:"runs"`
}

// RunPD runs the benchmark and writes results.json and summary.md into
// out.
func RunPD(ctx context.Context, repoRoot, out string, c PDConfig, log io.Writer) (*PDResult, error) {
	sc := DefaultSuiteConfig(repoRoot)
	if c.Prefill < 1 || c.Decode < 1 {
		return nil, fmt.Errorf("a split pool needs a prefill and a decode replica, got %d and %d", c.Prefill, c.Decode)
	}
	sc.Replicas = c.Prefill + c.Decode
	sc.OutDir = out
	env, err := NewEnv(sc, log)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	s := &suite{env: env, cfg: sc, cartBin: filepath.Join(sc.BinDir, "cart"), simBin: filepath.Join(sc.BinDir, "cart-sim")}
	for _, b := range []string{s.cartBin, s.simBin} {
		if _, err := os.Stat(b); err != nil {
			return nil, fmt.Errorf("%s missing: run make build first", b)
		}
	}
	res := &PDResult{StartedAt: time.Now().UTC(), Config: c, Suite: sc, Machine: CollectMachineInfo()}
	for _, trace := range c.Traces {
		w, info, err := s.buildWorkload(trace)
		if err != nil {
			return res, err
		}
		res.Slices = append(res.Slices, info)
		s.cacheTokens = info.CacheTokens
		for _, target := range c.Targets {
			run := s.pdRun(ctx, c, trace, target, w, info)
			env.Logf("%s via %s: %s TTFT p50 %.0f ms p99 %.0f ms, compute hit ratio %.3f %s", trace, target, run.Status,
				ttft(run, 50), ttft(run, 99), run.ComputeHitRatio, run.Reason)
			res.Runs = append(res.Runs, run)
			if ctx.Err() != nil {
				return res, ctx.Err()
			}
		}
	}
	res.Machine.LoadAvgEnd = LoadAvg()
	return res, writeResults(out, res, FormatPD(res))
}

func ttft(r PDRun, p int) float64 {
	if r.Summary == nil {
		return 0
	}
	if p == 50 {
		return r.Summary.TTFTMs.P50
	}
	return r.Summary.TTFTMs.P99
}

// pdRoles are a target's replica roles.
func pdRoles(target string, c PDConfig) []string {
	n := c.Prefill + c.Decode
	roles := make([]string, n)
	if target == "cart-agg" {
		return roles
	}
	for i := range roles {
		roles[i] = sim.RolePrefill
		if i >= c.Prefill {
			roles[i] = sim.RoleDecode
		}
	}
	return roles
}

func (s *suite) pdRun(ctx context.Context, c PDConfig, trace, target string, w *Workload, info SliceInfo) (run PDRun) {
	began := time.Now()
	roles := pdRoles(target, c)
	run = PDRun{Trace: trace, Target: target, Status: "ok", Roles: roles}
	defer func() { run.WallS = time.Since(began).Seconds() }()
	fail := func(status string, err error) PDRun {
		run.Status, run.Reason = status, err.Error()
		return run
	}
	s.extraSimArgs = []string{"--kv-transfer-us-per-token", fmt.Sprint(c.KVTransferUsPerToken)}
	defer func() { s.extraSimArgs = nil }()
	if err := s.startRoleReplicas(ctx, roles); err != nil {
		s.stopReplicas()
		return fail("skipped", err)
	}
	defer s.stopReplicas()
	dir := s.env.Path("pd__" + trace + "__" + target)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fail("failed", err)
	}
	port, err := s.env.FreePort()
	if err != nil {
		return fail("failed", err)
	}
	rc := CartRouterConfig{Port: port, Workers: s.replicaURLs(), Roles: roles, CacheTokens: s.cacheTokens, Blind: target == "blind-pd"}
	p, err := s.startRole(ctx, dir, target, "", rc, s.cartHealthy(port, len(s.replicas)))
	if p != nil {
		defer func() {
			if run.Status != "ok" {
				s.keepLogs([]*Proc{p}, "")
			}
			s.env.StopAll([]*Proc{p})
		}()
	}
	if err != nil {
		return fail("skipped", err)
	}
	cfg := DefaultRunConfig()
	cfg.Target, cfg.Workload, cfg.TracePath = baseURL(port), "trace", info.Path
	cfg.Start, cfg.Limit, cfg.Speedup, cfg.Rate, cfg.MaxTokensCap = s.cfg.Start, len(w.Requests), info.Speedup, info.Rate, s.cfg.MaxTokensCap
	cfg.Concurrency, cfg.RunTimeout = s.cfg.Concurrency, s.cfg.RunTimeout
	cfg.RequestTimeout = min(cfg.RequestTimeout, s.cfg.RunTimeout)
	computing := 0
	for _, r := range roles {
		if r != sim.RoleDecode {
			computing++
		}
	}
	cfg.PoolCacheTokens, cfg.BlockTokens, cfg.Replicas = s.cacheTokens*computing, s.cfg.Sim.BlockTokens, s.replicaNames()
	rr := ExecuteWorkload(ctx, cfg, w, trace+" "+target, s.env.Log)
	run.Summary, run.Oracle = &rr.Summary, rr.Summary.OracleHitRatio
	_, body, err := s.env.Get(baseURL(port) + "/metrics")
	if err == nil {
		run.RouterMetrics = ParseCounters(string(body), []string{"cart_pd_decisions_total", "cart_routing_decisions_total", "cart_retries_total",
			"cart_pd_leg_seconds_sum", "cart_pd_leg_seconds_count"})
		run.LegMeanMs = map[string]float64{}
		for _, leg := range []string{"prefill", "handoff", "decode_first_byte"} {
			sum, n := run.RouterMetrics[`cart_pd_leg_seconds_sum{leg="`+leg+`"}`], run.RouterMetrics[`cart_pd_leg_seconds_count{leg="`+leg+`"}`]
			if n > 0 {
				run.LegMeanMs[leg] = 1000 * sum / n
			}
		}
	}
	run.Replicas = map[string]SimStats{}
	var prompt, cached int64
	for i, r := range s.replicas {
		st, err := s.simStats(r)
		if err != nil {
			continue
		}
		run.Replicas[r.name] = st
		if roles[i] != sim.RoleDecode {
			prompt += st.PromptTokens
			cached += st.CachedTokens
		}
	}
	if prompt > 0 {
		run.ComputeHitRatio = float64(cached) / float64(prompt)
	}
	if rr.Summary.Succeeded == 0 {
		run.Status, run.Reason = "failed", fmt.Sprintf("no request succeeded: %v", rr.Summary.ErrorKinds)
	}
	return run
}

// startRoleReplicas starts one replica per role ("" = whole).
func (s *suite) startRoleReplicas(ctx context.Context, roles []string) error {
	for i, role := range roles {
		port, err := s.env.FreePort()
		if err != nil {
			return err
		}
		name := fmt.Sprintf("sim-%d", i+1)
		if role != "" {
			name = fmt.Sprintf("%s-%d", role, i+1)
		}
		r := &replica{name: name, port: port, role: role}
		s.replicas = append(s.replicas, r)
		if err := s.startReplica(ctx, r); err != nil {
			return err
		}
	}
	return nil
}

// FormatPD renders the runs as a Markdown table per trace.
func FormatPD(r *PDResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Prefill/decode: a split pool vs the same replicas whole\n\n%d cart-sim replicas (%d-token blocks, %g µs/token prefill, %g ms/token decode, time scale %g; split: %d prefill, %d decode, KV pull %g µs/token). \n\n%s\n",
		r.Config.Prefill+r.Config.Decode, r.Suite.Sim.BlockTokens, r.Suite.Sim.PrefillUsPerToken, r.Suite.Sim.DecodeMsPerToken, r.Suite.Sim.TimeScale,
		r.Config.Prefill, r.Config.Decode, r.Config.KVTransferUsPerToken, MachineMarkdown(r.Machine))
	for _, sl := range r.Slices {
		fmt.Fprintf(&b, "## %s\n\n%d requests, %s, %d cache tokens a replica.\n\n", sl.Trace, sl.Requests, sl.Arrivals, sl.CacheTokens)
		b.WriteString("| target | hit ratio where prompts are computed | / oracle of their caches | TTFT p50 (ms) | TTFT p99 (ms) | errors | split / whole | mean prefill leg / handoff / decode first byte (ms) |\n|---|---|---|---|---|---|---|---|\n")
		for _, run := range r.Runs {
			if run.Trace != sl.Trace {
				continue
			}
			if run.Status != "ok" || run.Summary == nil {
				fmt.Fprintf(&b, "| %s | %s: %s |||||||\n", run.Target, run.Status, run.Reason)
				continue
			}
			split := run.RouterMetrics[`cart_pd_decisions_total{outcome="split"}`]
			whole := run.RouterMetrics[`cart_pd_decisions_total{outcome="no_prefill"}`] + run.RouterMetrics[`cart_pd_decisions_total{outcome="no_decode"}`] +
				run.RouterMetrics[`cart_pd_decisions_total{outcome="short_prompt"}`]
			legs := "-"
			if len(run.LegMeanMs) > 0 {
				legs = fmt.Sprintf("%.1f / %.2f / %.1f", run.LegMeanMs["prefill"], run.LegMeanMs["handoff"], run.LegMeanMs["decode_first_byte"])
			}
			vsOracle := 0.0
			if run.Oracle > 0 {
				vsOracle = run.ComputeHitRatio / run.Oracle
			}
			fmt.Fprintf(&b, "| %s | **%.3f** | %.2f | %.0f | %.0f | %d | %.0f / %.0f | %s |\n", run.Target, run.ComputeHitRatio, vsOracle,
				run.Summary.TTFTMs.P50, run.Summary.TTFTMs.P99, run.Summary.Errors, split, whole, legs)
		}
		b.WriteString("\n")
	}
	return b.String()
}
