package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// RunConfig is everything one load-generator run needs; it is written into
// the run's JSON file.
type RunConfig struct {
	// Target is the endpoint's base URL (http://host:port, /v1 optional).
	Target string `json:"target"`
	Model  string `json:"model"`
	// Workload is "trace", "gsp" or "multiturn".
	Workload string `json:"workload"`

	TracePath string  `json:"trace_path,omitempty"`
	Start     int     `json:"start"`
	Limit     int     `json:"limit"`
	Speedup   float64 `json:"speedup"`
	// Rate, when > 0, replaces trace timestamps with Poisson arrivals.
	Rate         float64 `json:"rate"`
	MaxTokensCap int     `json:"max_tokens_cap"`
	Seed         uint64  `json:"seed"`

	GSP       GSPConfig       `json:"gsp"`
	MultiTurn MultiTurnConfig `json:"multiturn"`

	Concurrency    int           `json:"concurrency"`
	RequestTimeout time.Duration `json:"request_timeout_ns"`
	RunTimeout     time.Duration `json:"run_timeout_ns"`

	// PoolCacheTokens is the pool's total cache capacity for the oracle
	// (0 = unbounded); BlockTokens the replicas' block size.
	PoolCacheTokens int `json:"pool_cache_tokens"`
	BlockTokens     int `json:"block_tokens"`
	// Replicas lists the pool's replica names (X-Sim-Replica), so idle
	// replicas count in the imbalance.
	Replicas []string `json:"replicas,omitempty"`
	// RecordRequests keeps per-request records in the JSON output.
	RecordRequests bool `json:"record_requests"`
}

// DefaultRunConfig returns the load generator's defaults.
func DefaultRunConfig() RunConfig {
	return RunConfig{
		Target: "http://127.0.0.1:6700", Model: "cart-sim", Workload: "trace",
		Speedup: 1, MaxTokensCap: 64, Seed: 1,
		GSP: DefaultGSP(), MultiTurn: DefaultMultiTurn(),
		Concurrency: 512, RequestTimeout: 5 * time.Minute, RunTimeout: 30 * time.Minute,
		BlockTokens: 16,
	}
}

// RunResult is one run's JSON file.
type RunResult struct {
	Label     string    `json:"label,omitempty"`
	StartedAt time.Time `json:"started_at"`
	Config    RunConfig `json:"config"`
	Summary   Summary   `json:"summary"`
	Records   []Record  `json:"records,omitempty"`
}

// BuildWorkload makes the workload a config describes.
func BuildWorkload(c RunConfig) (*Workload, error) {
	switch c.Workload {
	case "trace", "":
		if c.TracePath == "" {
			return nil, fmt.Errorf("trace workload needs a trace file")
		}
		recs, err := LoadTrace(c.TracePath)
		if err != nil {
			return nil, err
		}
		recs = SliceTrace(recs, c.Start, c.Limit)
		if len(recs) == 0 {
			return nil, fmt.Errorf("%s: --start %d is past the end of the trace", c.TracePath, c.Start)
		}
		name := trimExt(filepath.Base(c.TracePath))
		return TraceWorkload(name, recs, TraceOptions{Speedup: c.Speedup, Rate: c.Rate, MaxTokensCap: c.MaxTokensCap, Seed: c.Seed}), nil
	case "gsp":
		g := c.GSP
		if c.Rate > 0 {
			g.Rate = c.Rate
		}
		w, err := GSPWorkload(g, c.MaxTokensCap)
		if err != nil {
			return nil, err
		}
		if c.Limit > 0 && c.Limit < len(w.Requests) {
			w.Requests = w.Requests[:c.Limit]
		}
		return w, nil
	case "multiturn":
		return MultiTurnWorkload(c.MultiTurn, c.MaxTokensCap)
	default:
		return nil, fmt.Errorf("unknown workload %q (trace, gsp or multiturn)", c.Workload)
	}
}

func trimExt(s string) string {
	if e := filepath.Ext(s); e != "" {
		return s[:len(s)-len(e)]
	}
	return s
}

// Execute builds the workload, runs it against c.Target and summarizes.
func Execute(ctx context.Context, c RunConfig, label string, progress io.Writer) (*RunResult, error) {
	w, err := BuildWorkload(c)
	if err != nil {
		return nil, err
	}
	return ExecuteWorkload(ctx, c, w, label, progress), nil
}

// ExecuteWorkload runs an already built workload.
func ExecuteWorkload(ctx context.Context, c RunConfig, w *Workload, label string, progress io.Writer) *RunResult {
	hc := NewHTTPClient(c.Concurrency)
	defer hc.CloseIdleConnections()
	sender := NewOpenAISender(c.Target, c.Model, hc)
	res := &RunResult{Label: label, StartedAt: time.Now().UTC(), Config: c}
	recs := Run(ctx, w, sender, RunOptions{
		Label: label, Concurrency: c.Concurrency, RequestTimeout: c.RequestTimeout, RunTimeout: c.RunTimeout,
		OracleCapacityTokens: c.PoolCacheTokens, BlockTokens: c.BlockTokens, Progress: progress,
	})
	res.Summary = Summarize(recs, c.Replicas)
	if c.RecordRequests {
		res.Records = recs
	}
	return res
}

// WriteJSON writes v, indented, to path (creating its directory).
func WriteJSON(path string, v any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// FormatSummary renders a summary as a few human-readable lines.
func FormatSummary(s Summary) string {
	return fmt.Sprintf(`requests %d: %d ok, %d errors%s, %d cap-delayed, %d not sent
hit ratio %.1f%% (oracle %.1f%%, %.0f%% of oracle)
TTFT ms p50 %.0f p90 %.0f p99 %.0f | E2E ms p50 %.0f p99 %.0f
throughput %.2f req/s, %.0f tokens/s (%.0f output tokens/s) over %.1fs
per replica %v (imbalance max/mean %.2f)
`,
		s.Requests, s.Succeeded, s.Errors, fmtKinds(s.ErrorKinds), s.CapDelayed, s.NotSent,
		100*s.HitRatio, 100*s.OracleHitRatio, 100*s.HitVsOracle,
		s.TTFTMs.P50, s.TTFTMs.P90, s.TTFTMs.P99, s.E2EMs.P50, s.E2EMs.P99,
		s.ReqPerS, s.TokensPerS, s.OutputTokensPerS, s.DurationS,
		s.PerReplica, s.Imbalance)
}

func fmtKinds(k map[string]int) string {
	if len(k) == 0 {
		return ""
	}
	return fmt.Sprintf(" %v", k)
}
