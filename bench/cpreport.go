package bench

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cartrouter/cart/config"
)

// table is a header and rows, rendered as text or markdown.
type table struct {
	header []string
	rows   [][]string
}

func (t table) text() string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(t.header, "\t"))
	for _, r := range t.rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	_ = tw.Flush()
	return b.String()
}

func (t table) markdown() string {
	var b strings.Builder
	b.WriteString("| " + strings.Join(t.header, " | ") + " |\n|")
	b.WriteString(strings.Repeat("---|", len(t.header)) + "\n")
	for _, r := range t.rows {
		esc := make([]string, len(r))
		for i, c := range r {
			esc[i] = mdEscape(c)
		}
		b.WriteString("| " + strings.Join(esc, " | ") + " |\n")
	}
	return b.String()
}

// usOrMs renders a duration given in µs with a unit that keeps it short.
func usOrMs(us float64) string {
	switch {
	case us <= 0:
		return "-"
	case us >= 1000:
		return fmt.Sprintf("%.1f ms", us/1000)
	default:
		return fmt.Sprintf("%.0f µs", us)
	}
}

func msCell(ms float64) string {
	if ms >= 10 {
		return fmt.Sprintf("%.0f ms", ms)
	}
	return fmt.Sprintf("%.2f ms", ms)
}

func countsCell(n int, by map[string]int) string {
	if n == 0 || len(by) == 0 {
		return fmt.Sprint(n)
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(by)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, by[k]))
	}
	return fmt.Sprintf("%d (%s)", n, strings.Join(parts, ", "))
}

// fallbacksCell is the run's fallbacks by cause and how they bunch in
// time.
func fallbacksCell(r CPRun) string {
	s := countsCell(r.Fallbacks, r.FallbackCauses)
	if r.Fallbacks > 0 && r.FallbackWindows > 0 {
		s += fmt.Sprintf(" in %d × %s, ≤ %d in one", r.FallbackWindows, fallbackWindow, r.FallbackWindowMax)
		if r.BenchStalls > 0 {
			s += fmt.Sprintf("; %d of those during the bench's own stalls (%d ≥ %s, max %.0f ms)",
				r.FallbackWindowsInBenchStalls, r.BenchStalls, stallMin, r.BenchStallMaxMs)
		}
	}
	return s
}

// atLeast renders a percentile, marked "≥" when it lies past the
// histogram's last finite bucket (the bound is then all that is known).
func atLeast(us float64, beyond bool) string {
	if beyond {
		return "≥ " + usOrMs(us)
	}
	return usOrMs(us)
}

func lockHoldCell(r CPRun) string {
	if r.LockHoldP99Us <= 0 {
		return "-"
	}
	max := "≤ " + usOrMs(r.LockHoldMaxUs)
	if r.LockHoldOverflow {
		max = "> " + usOrMs(r.LockHoldMaxUs)
	}
	return atLeast(r.LockHoldP99Us, r.LockHoldP99Beyond) + " / " + max
}

func leaderCell(r CPRun) string {
	if r.StepDowns == 0 && r.Leader == r.LeaderAfter {
		return "0"
	}
	return fmt.Sprintf("%d (%s → %s)", r.StepDowns, r.Leader, r.LeaderAfter)
}

// cpTable is the control-plane section as a table, one row per run.
func cpTable(res CPResult) table {
	t := table{header: []string{"run", "routes/s", "p50", "p90", "p99", "decide p99", "lock hold p99 / max",
		"CPU µs/route leader / followers / bench", "fallbacks", "errors", "step-downs", "loadavg"}}
	for _, r := range res.Runs {
		t.rows = append(t.rows, []string{r.Name, fmt.Sprintf("%.0f", r.RoutesPerS),
			msCell(r.LatencyMs.P50), msCell(r.LatencyMs.P90), msCell(r.LatencyMs.P99),
			atLeast(r.DecideP99Us, r.DecideP99Beyond), lockHoldCell(r),
			fmt.Sprintf("%.0f / %.0f / %.0f", r.CPULeaderUs, r.CPUFollowersUs, r.CPUBenchUs),
			fallbacksCell(r), fmt.Sprint(r.Errors), leaderCell(r), r.LoadAvg})
	}
	return t
}

func cpRunLine(r CPRun) string {
	return fmt.Sprintf("%.0f routes/s, p50 %s p99 %s, decide p99 %s, lock hold p99 %s, CPU µs/route %.0f/%.0f/%.0f, fallbacks %s, %d errors, %d step-downs",
		r.RoutesPerS, msCell(r.LatencyMs.P50), msCell(r.LatencyMs.P99), atLeast(r.DecideP99Us, r.DecideP99Beyond), lockHoldCell(r),
		r.CPULeaderUs, r.CPUFollowersUs, r.CPUBenchUs, fallbacksCell(r), r.Errors, r.StepDowns)
}

// routeTimeoutText names the data planes' route timeout (0: the default).
func routeTimeoutText(d time.Duration) string {
	if d > 0 {
		return d.String()
	}
	return fmt.Sprintf("%s (the config default)", config.Default().DataPlane.RouteTimeout())
}

func cpIntro(res CPResult) string {
	c := res.Config
	timeout := routeTimeoutText(c.RouteTimeout)
	path := "Route, Complete and Sync on one stream per data plane, with the leader's placement feed"
	switch {
	case c.Unary:
		path = "one unary call per Route (--unary)"
	case c.NoPlacementFeed:
		path = "Route, Complete and Sync on one stream per data plane, no placement feed"
	}
	var but []string
	if c.BlockChars > 0 {
		but = append(but, fmt.Sprintf("cache.block_chars %d, the data planes too", c.BlockChars))
	}
	if c.PlacementBatchMs > 0 {
		but = append(but, fmt.Sprintf("controlplane.placement_batch_ms %d", c.PlacementBatchMs))
	}
	conf := "default config"
	if len(but) > 0 {
		conf += " but " + strings.Join(but, " and ")
	}
	conf += ", " + procsText(c.NodeProcs)
	warm := "the first runs see the index fill"
	if c.Warmup > 0 {
		warm = fmt.Sprintf("after a %s warm-up at %d/s that fills the index", c.Warmup, c.warmupRate())
	}
	return fmt.Sprintf("%d `cart controlplane` processes (Raft, %s), %d data planes in the bench process (the data plane's own control-plane client, %s, route timeout %s), %d workers; every call a new 2.5k-10k-character prompt sharing one of %d 2k-character prefixes, settled at once (1 in %d undelivered); %s per run, %s. "+
		"Routes/s, latency and CPU: the calls the control plane answered, as the data plane saw them (fallbacks counted apart, all-call p99 in results.json). Decide and lock hold: the leader's cart_cp_route_seconds and cart_decider_lock_hold_seconds (every op) over the run. CPU: per answered call; followers summed. Step-downs: Raft terms that passed during the run.",
		c.Nodes, conf, c.DataPlanes, path, timeout, c.Workers, cpGroups, cpUndelivered, c.Duration, warm)
}

// FormatCP renders the control-plane section for a terminal.
func FormatCP(res CPResult) string {
	if res.Skipped != "" {
		return "control plane: skipped: " + res.Skipped + "\n"
	}
	return cpIntro(res) + "\n\n" + cpTable(res).text() + lockHoldByOp(res)
}

// mdSection renders one section of summary.md: its title, then either why
// it was skipped or the intro, the table and the notes under it.
func mdSection(title, skipped, intro string, t table, notes string) string {
	var b strings.Builder
	b.WriteString("## " + title + "\n\n")
	if skipped != "" {
		fmt.Fprintf(&b, "Skipped: %s\n\n", mdEscape(skipped))
		return b.String()
	}
	b.WriteString(intro + "\n\n" + t.markdown())
	if notes != "" {
		b.WriteString("\n" + notes)
	}
	b.WriteString("\n")
	return b.String()
}

// cpMarkdown renders the control-plane section of summary.md.
func cpMarkdown(res *CPResult) string {
	notes := lockHoldByOp(*res)
	for _, r := range res.Runs {
		if r.Note != "" {
			notes += fmt.Sprintf("- %s: %s\n", r.Name, mdEscape(r.Note))
		}
	}
	return mdSection("Control plane", res.Skipped, cpIntro(*res), cpTable(*res), notes)
}

// lockHoldByOp lists, per run, the ops whose p99 hold is the longest,
// then, per run, how long the leader's goroutines waited to run.
func lockHoldByOp(res CPResult) string {
	var b strings.Builder
	for _, r := range res.Runs {
		if len(r.LockHoldP99ByOpUs) == 0 {
			continue
		}
		ops := slices.Sorted(maps.Keys(r.LockHoldP99ByOpUs))
		slices.SortStableFunc(ops, func(a, c string) int {
			x, y := r.LockHoldP99ByOpUs[a], r.LockHoldP99ByOpUs[c]
			switch {
			case x > y:
				return -1
			case x < y:
				return 1
			}
			return 0
		})
		var parts []string
		for _, op := range ops[:min(4, len(ops))] {
			parts = append(parts, fmt.Sprintf("%s %s", op, usOrMs(r.LockHoldP99ByOpUs[op])))
		}
		fmt.Fprintf(&b, "- lock hold p99 by op, %s: %s\n", r.Name, strings.Join(parts, ", "))
	}
	for _, r := range res.Runs {
		if len(r.LockHoldMaxByOpUs) == 0 {
			continue
		}
		var parts []string
		for _, op := range slices.Sorted(maps.Keys(r.LockHoldMaxByOpUs)) {
			if us := r.LockHoldMaxByOpUs[op]; us < 0 {
				parts = append(parts, op+" > 100 ms")
			} else if us > 1000 {
				parts = append(parts, fmt.Sprintf("%s ≤ %s", op, usOrMs(us)))
			}
		}
		if len(parts) > 0 {
			fmt.Fprintf(&b, "- ops that held the lock over 1 ms, %s: %s\n", r.Name, strings.Join(parts, ", "))
		}
	}
	for _, r := range res.Runs {
		if w, ok := r.LockWaitP99ByOpUs["route"]; ok {
			fmt.Fprintf(&b, "- decisions' wait for the lock (cart_decider_lock_wait_seconds{op=\"route\"}), %s: p99 %s\n", r.Name, usOrMs(w))
		}
	}
	for _, r := range res.Runs {
		if len(r.IndexPerS) > 0 {
			fmt.Fprintf(&b, "- leader's prefix index, %s: %.0f evicted/s, %.0f new blocks skipped/s (full before a pass made room), %.1f passes/s found it past half its headroom\n", r.Name,
				r.IndexPerS["cart_cp_index_evictions_total"], r.IndexPerS["cart_cp_index_skipped_inserts_total"], r.IndexPerS["cart_decider_pressure_passes_total"])
		}
	}
	for _, r := range res.Runs {
		if line := streamLine(r); line != "" {
			fmt.Fprintf(&b, "- leader's Route streams, %s: %s\n", r.Name, line)
		}
	}
	for _, r := range res.Runs {
		if r.LeaderSchedMaxUs > 0 {
			fmt.Fprintf(&b, "- leader's goroutines waiting to run (go_sched_latencies_seconds), %s: p99 %s, max ≤ %s\n", r.Name, usOrMs(r.LeaderSchedP99Us), usOrMs(r.LeaderSchedMaxUs))
		}
	}
	return b.String()
}

func secsOrNone(s float64) string {
	if s < 0 {
		return "none in window"
	}
	return fmt.Sprintf("%.2f s", s)
}

func windowCell(w FailoverWindow) string {
	return fmt.Sprintf("%.1f%% (%d req, %.0f%% fallback)", 100*w.HitRatio(), w.Requests, 100*w.FallbackShare())
}

// failoverTable is the failover section, one row per leader kill.
func failoverTable(res FailoverResult) table {
	t := table{header: []string{"run", "steady hit", "kill-window hit", "window / steady", "client errors", "election", "first leader route",
		"hit before / after it", "next window hit", "fallback causes in window", "loadavg"}}
	for i, r := range res.Runs {
		name := fmt.Sprintf("%d (killed %s)", i+1, r.Killed)
		if r.Error != "" {
			name += ": " + r.Error
		}
		t.rows = append(t.rows, []string{name, windowCell(r.Steady), windowCell(r.Window), fmt.Sprintf("%.3f", r.Ratio),
			fmt.Sprint(r.Steady.Errors + r.Window.Errors + r.Post.Errors), secsOrNone(r.ElectionS), secsOrNone(r.FirstLeaderRouteS),
			fmt.Sprintf("%.1f%% / %.1f%%", 100*r.BeforeLeader.HitRatio(), 100*r.AfterLeader.HitRatio()), windowCell(r.Post),
			countsCell(sumCounts(r.Causes), r.Causes), r.LoadAvg})
	}
	return t
}

func sumCounts(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func foRunLine(r FailoverRun) string {
	return fmt.Sprintf("killed %s: hit steady %.1f%%, kill window %.1f%% (x%.3f), %d client errors, election %s, first leader route %s",
		r.Killed, 100*r.Steady.HitRatio(), 100*r.Window.HitRatio(), r.Ratio, r.Steady.Errors+r.Window.Errors+r.Post.Errors,
		secsOrNone(r.ElectionS), secsOrNone(r.FirstLeaderRouteS))
}

func failoverIntro(res FailoverResult) string {
	c := res.Config
	timeout := routeTimeoutText(c.RouteTimeout)
	feed := "the leader's placement feed on the stream"
	switch {
	case c.Unary:
		feed = "unary calls, no placement feed"
	case c.NoPlacementFeed:
		feed = "no placement feed"
	}
	return fmt.Sprintf("3 `cart controlplane` processes (%s), %d data planes in the bench process (the data plane's router: shadow index and control-plane breaker at their defaults, %s, route timeout %s), 4 workers whose caches are modelled as LRUs of %d of the %d prefix groups; %d clients keeping two requests open, %s pause. "+
		"After %s of load, a %s steady window, then SIGKILL to the leader and a %s kill window. Hit = a repeated group landing on a worker caching it. Election: until a survivor says it leads; first leader route: until the first Route sent after the kill that the control plane answered.",
		procsText(c.NodeProcs), c.DataPlanes, feed, timeout, c.CacheGroups, c.Groups, c.Clients, c.Pace, c.Settle, c.Window, c.Window)
}

// FormatFailover renders the failover section for a terminal.
func FormatFailover(res FailoverResult) string {
	if res.Skipped != "" {
		return "failover: skipped: " + res.Skipped + "\n"
	}
	return failoverIntro(res) + "\n\n" + failoverTable(res).text()
}

func failoverMarkdown(res *FailoverResult) string {
	return mdSection("Failover", res.Skipped, failoverIntro(*res), failoverTable(*res), "")
}

// procsText says what GOMAXPROCS the control-plane nodes ran with.
func procsText(n int) string {
	if n <= 0 {
		return "GOMAXPROCS Go's default, every CPU"
	}
	return fmt.Sprintf("GOMAXPROCS %d each", n)
}

// streamLine says how much the leader's Route-stream messages carried in a
// run, and how many of them an answered route cost; "" without the
// counters.
func streamLine(r CPRun) string {
	in, inItems := r.StreamPerS[`cart_cp_stream_messages_total{direction="received"}`], r.StreamPerS[`cart_cp_stream_items_total{direction="received"}`]
	out, outItems := r.StreamPerS[`cart_cp_stream_messages_total{direction="sent"}`], r.StreamPerS[`cart_cp_stream_items_total{direction="sent"}`]
	if in <= 0 || out <= 0 || r.RoutesPerS <= 0 {
		return ""
	}
	return fmt.Sprintf("%.2f calls a message in, %.2f answers or feed frames a message out; per answered route %.2f messages in and %.2f out",
		inItems/in, outItems/out, in/r.RoutesPerS, out/r.RoutesPerS)
}
