package bench

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"gonum.org/v1/plot/plotter"
)

// WriteReport writes results.json, summary.md, machine.md and the charts.
func WriteReport(dir string, res *SuiteResults) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	charts, chartErr := WriteCharts(dir, res)
	if chartErr != nil {
		res.Notes = append(res.Notes, "charts: "+chartErr.Error())
	}
	errs := []error{
		WriteJSON(filepath.Join(dir, "results.json"), res),
		os.WriteFile(filepath.Join(dir, "summary.md"), []byte(SummaryMarkdown(res, charts)), 0o644),
		os.WriteFile(filepath.Join(dir, "machine.md"), []byte(MachineMarkdown(res.Machine)), 0o644),
	}
	return errors.Join(errs...)
}

// writeResults writes a scenario benchmark's results.json and summary.md
// into out (nothing when out is empty).
func writeResults(out string, res any, summary string) error {
	if out == "" {
		return nil
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	return errors.Join(WriteJSON(filepath.Join(out, "results.json"), res),
		os.WriteFile(filepath.Join(out, "summary.md"), []byte(summary), 0o644))
}

func traceOrder(res *SuiteResults) []string {
	var out []string
	seen := map[string]bool{}
	for _, s := range res.Slices {
		if !seen[s.Trace] {
			seen[s.Trace] = true
			out = append(out, s.Trace)
		}
	}
	for _, s := range res.Scenarios {
		if !seen[s.Trace] {
			seen[s.Trace] = true
			out = append(out, s.Trace)
		}
	}
	return out
}

func scenarioOrder(res *SuiteResults) []string {
	var out []string
	seen := map[string]bool{}
	for _, s := range res.Scenarios {
		if !seen[s.Scenario] {
			seen[s.Scenario] = true
			out = append(out, s.Scenario)
		}
	}
	return out
}

func findResult(res *SuiteResults, trace, sc string) *ScenarioResult {
	for i := range res.Scenarios {
		r := &res.Scenarios[i]
		if r.Trace == trace && r.Scenario == sc && r.Status == "ok" && r.Summary != nil {
			return r
		}
	}
	return nil
}

// WriteCharts draws the PNG charts that have data and returns their file
// names.
func WriteCharts(dir string, res *SuiteResults) ([]string, error) {
	traces := traceOrder(res)
	scs := scenarioOrder(res)
	var files []string
	var errs []error
	if len(traces) == 0 || len(scs) == 0 {
		return nil, nil
	}

	// Hit ratio by scenario, one bar set per trace, oracle as dashed lines.
	var hit []BarSeries
	var refs []RefLine
	have := false
	for ti, t := range traces {
		s := BarSeries{Name: t, Values: make([]float64, len(scs))}
		oracle := math.NaN()
		for i, sc := range scs {
			s.Values[i] = math.NaN()
			if r := findResult(res, t, sc); r != nil {
				s.Values[i] = 100 * r.Summary.HitRatio
				oracle = 100 * r.Summary.OracleHitRatio
				have = true
			}
		}
		hit = append(hit, s)
		if !math.IsNaN(oracle) {
			refs = append(refs, RefLine{Name: t + " oracle", Y: oracle, Color: ti})
		}
	}
	if have {
		f := "hit_ratio.png"
		if err := BarChart(filepath.Join(dir, f), "Prefix-cache hit ratio by scenario", "hit ratio (% of prompt tokens)", scs, hit, refs); err != nil {
			errs = append(errs, err)
		} else {
			files = append(files, f)
		}
	}

	// TTFT p50/p99 by scenario, one chart per trace.
	for _, t := range traces {
		p50 := BarSeries{Name: "TTFT p50", Values: make([]float64, len(scs))}
		p99 := BarSeries{Name: "TTFT p99", Values: make([]float64, len(scs))}
		have := false
		for i, sc := range scs {
			p50.Values[i], p99.Values[i] = math.NaN(), math.NaN()
			if r := findResult(res, t, sc); r != nil {
				p50.Values[i], p99.Values[i] = r.Summary.TTFTMs.P50/1000, r.Summary.TTFTMs.P99/1000
				have = true
			}
		}
		if !have {
			continue
		}
		f := "ttft_" + t + ".png"
		if err := BarChart(filepath.Join(dir, f), "TTFT by scenario: "+t, "seconds", scs, []BarSeries{p50, p99}, nil); err != nil {
			errs = append(errs, err)
		} else {
			files = append(files, f)
		}
	}

	// Hit ratio vs number of data planes.
	var lines []LineSeries
	var dpRefs []RefLine
	anyDP := false
	for ti, t := range traces {
		dist := LineSeries{Name: t + " distributed", Color: ti}
		var split plotter.XYs
		for _, sc := range scs {
			r := findResult(res, t, sc)
			if r == nil {
				continue
			}
			switch {
			case strings.HasPrefix(sc, ScenarioDistPrefix):
				dist.Points = append(dist.Points, plotter.XY{X: float64(r.DataPlanes), Y: 100 * r.Summary.HitRatio})
				anyDP = true
			case sc == ScenarioSplit:
				split = append(split, plotter.XY{X: float64(r.DataPlanes), Y: 100 * r.Summary.HitRatio})
				anyDP = true
			case sc == ScenarioCart:
				dpRefs = append(dpRefs, RefLine{Name: t + " all-in-one", Y: 100 * r.Summary.HitRatio, Color: ti})
			}
		}
		sort.Slice(dist.Points, func(a, b int) bool { return dist.Points[a].X < dist.Points[b].X })
		lines = append(lines, dist)
		if len(split) > 0 {
			lines = append(lines, LineSeries{Name: t + " split (independent routers)", Points: split, Markers: true, Color: ti})
		}
	}
	if anyDP {
		f := "hit_vs_dataplanes.png"
		if err := LineChart(filepath.Join(dir, f), "Hit ratio vs number of routers", "data planes / routers behind HAProxy", "hit ratio (% of prompt tokens)",
			[]float64{1, 2, 4}, lines, dpRefs); err != nil {
			errs = append(errs, err)
		} else {
			files = append(files, f)
		}
	}
	return files, errors.Join(errs...)
}

func pct(x float64) string { return fmt.Sprintf("%.1f%%", 100*x) }

func secs(msv float64) string {
	if msv >= 1000 {
		return fmt.Sprintf("%.2f s", msv/1000)
	}
	return fmt.Sprintf("%.0f ms", msv)
}

// SummaryMarkdown renders summary.md.
func SummaryMarkdown(res *SuiteResults, charts []string) string {
	var b strings.Builder
	c := res.Config
	fmt.Fprintf(&b, "# CART benchmark suite — %s\n\n", res.StartedAt.Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "Pool: %d simulated replicas (cart-sim, cache size per trace below), %d-token blocks, prefill %g µs/token, decode %g ms/token (+%g per extra running request), %d prefill slot(s), time scale %g (every delay multiplied by it). ",
		c.Replicas, c.Sim.BlockTokens, c.Sim.PrefillUsPerToken, c.Sim.DecodeMsPerToken, c.Sim.DecodeSlowdown, c.Sim.MaxConcurrency, c.Sim.TimeScale)
	fmt.Fprintf(&b, "max_tokens capped at %d; streaming chat completions, open loop (safety cap %d in flight). Every scenario starts with empty replica caches and fresh routers.\n\n", c.MaxTokensCap, c.Concurrency)
	if len(res.Slices) > 0 {
		b.WriteString("| trace | requests | first record | arrival span | arrivals | cache per replica (tokens) |\n|---|---|---|---|---|---|\n")
		for _, s := range res.Slices {
			fmt.Fprintf(&b, "| %s | %d | %d | %.1f s | %s | %s |\n", s.Trace, s.Requests, s.Start, s.SpanS, s.Arrivals, tokensOrUnbounded(s.CacheTokens))
		}
		b.WriteString("\n")
	}
	b.WriteString("Hit ratio = Σ cached / Σ prompt tokens as reported in each response's usage. Oracle = the same request sequence through one LRU cache as large as the whole pool (the ceiling). Replica hit = the replicas' own counters (cross-check). Imbalance = max/mean successful requests per replica (1 = even).\n\n")
	for _, t := range traceOrder(res) {
		fmt.Fprintf(&b, "## %s\n\n", t)
		b.WriteString("| scenario | hit ratio | oracle | hit/oracle | replica hit | TTFT p50 | TTFT p90 | TTFT p99 | E2E p50 | E2E p99 | throughput | errors | imbalance max/mean |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range res.Scenarios {
			if r.Trace != t {
				continue
			}
			if r.Status != "ok" || r.Summary == nil {
				fmt.Fprintf(&b, "| %s | %s: %s | | | | | | | | | | | |\n", r.Scenario, r.Status, mdEscape(r.Reason))
				continue
			}
			s := r.Summary
			errs := fmt.Sprint(s.Errors)
			if s.Errors > 0 {
				errs += " " + mdEscape(fmt.Sprint(s.ErrorKinds))
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %.2f | %s | %s | %s | %s | %s | %s | %.2f req/s, %.0f tok/s | %s | %.2f |\n",
				r.Scenario, pct(s.HitRatio), pct(s.OracleHitRatio), s.HitVsOracle, pct(r.ReplicaHitRatio),
				secs(s.TTFTMs.P50), secs(s.TTFTMs.P90), secs(s.TTFTMs.P99), secs(s.E2EMs.P50), secs(s.E2EMs.P99),
				s.ReqPerS, s.TokensPerS, errs, s.Imbalance)
		}
		b.WriteString("\n")
		for _, r := range res.Scenarios {
			if r.Trace == t && len(r.RouterMetrics) > 0 {
				fmt.Fprintf(&b, "- %s router counters: %s\n", r.Scenario, mdEscape(formatCounters(r.RouterMetrics)))
			}
		}
		b.WriteString("\n")
	}
	if o := res.Overhead; o != nil {
		fmt.Fprintf(&b, "## Proxy overhead\n\nOne cart-sim with --time-scale 0 (answers at once), tiny non-streaming chat requests (%d-character prompt, max_tokens 1), closed loop at concurrency %d for %s per target. CPU µs/req: user+system CPU of the target's own processes over the loop, per request (the replica's not counted, except for direct, which is the replica).\n\n",
			o.Config.PromptChars, o.Config.Concurrency, o.Config.Duration)
		b.WriteString("| target | req/s | p50 | p99 | requests | errors | tool | CPU µs/req |\n|---|---|---|---|---|---|---|---|\n")
		for _, t := range o.Targets {
			if t.Skipped != "" {
				fmt.Fprintf(&b, "| %s | skipped: %s | | | | | | |\n", t.Name, mdEscape(t.Skipped))
				continue
			}
			cpu := "not measured"
			if t.CPUUsPerReq > 0 {
				cpu = fmt.Sprintf("%.0f", t.CPUUsPerReq)
			}
			fmt.Fprintf(&b, "| %s | %.0f | %.2f ms | %.2f ms | %d | %d | %s | %s |\n", t.Name, t.ReqPerS, t.P50Ms, t.P99Ms, t.Requests, t.Errors, t.Tool, cpu)
		}
		if len(o.Rounds) > 1 {
			b.WriteString("\nRounds (nginx, Caddy, then CART, alternating; all kept running):\n\n| round | nginx | Caddy | CART | CART / nginx | CART / Caddy |\n|---|---|---|---|---|---|\n")
			for i, rd := range o.Rounds {
				fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s |\n", i+1, roundTarget(rd.Nginx), roundTarget(rd.Caddy), roundTarget(rd.Cart),
					roundRatio(rd.CartOverNginx), roundRatio(rd.CartOverCaddy))
			}
		}
		if o.CartOverNginx > 0 {
			fmt.Fprintf(&b, "\nCART / nginx throughput: **%.2f**%s\n", o.CartOverNginx, o.medianNote("rows"))
		}
		if o.CartOverCaddy > 0 {
			fmt.Fprintf(&b, "\nCART / Caddy throughput: **%.2f**%s\n", o.CartOverCaddy, o.caddyMedianNote())
		}
		b.WriteString("\n")
	}
	if res.ControlPlane != nil {
		b.WriteString(cpMarkdown(res.ControlPlane))
		b.WriteString("\n")
	}
	if res.Failover != nil {
		b.WriteString(failoverMarkdown(res.Failover))
		b.WriteString("\n")
	}
	if len(charts) > 0 {
		b.WriteString("## Charts\n\n")
		for _, f := range charts {
			fmt.Fprintf(&b, "![%s](%s)\n\n", f, f)
		}
	}
	if len(res.Notes) > 0 {
		b.WriteString("## Notes\n\n")
		for _, n := range res.Notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "Wall time %.1f min. Machine: see machine.md. Raw numbers: results.json and runs/.\n", res.FinishedAt.Sub(res.StartedAt).Minutes())
	return b.String()
}

func tokensOrUnbounded(n int) string {
	if n <= 0 {
		return "unbounded"
	}
	return fmt.Sprint(n)
}

func mdEscape(s string) string {
	s = strings.ReplaceAll(s, "|", "\\|")
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 240 {
		s = s[:240] + "…"
	}
	return s
}

// formatCounters renders router counters compactly, sorted.
func formatCounters(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		name := strings.TrimSuffix(strings.TrimPrefix(k, "cart_"), "_total")
		name = strings.Replace(name, "_total{", "{", 1)
		parts = append(parts, fmt.Sprintf("%s=%g", name, m[k]))
	}
	return strings.Join(parts, ", ")
}
