package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cartrouter/cart/config"
)

// exposition is a /metrics excerpt as client_golang writes it: two lock
// hold series (one of them with a hold past the last bucket), the decide
// histogram, and metrics whose names share their prefixes.
const exposition = `# HELP cart_decider_lock_hold_seconds How long...
# TYPE cart_decider_lock_hold_seconds histogram
cart_decider_lock_hold_seconds_bucket{op="route",le="0.0001"} 90
cart_decider_lock_hold_seconds_bucket{op="route",le="0.001"} 100
cart_decider_lock_hold_seconds_bucket{op="route",le="+Inf"} 100
cart_decider_lock_hold_seconds_sum{op="route"} 0.005
cart_decider_lock_hold_seconds_count{op="route"} 100
cart_decider_lock_hold_seconds_bucket{op="snapshot_capture",le="0.0001"} 0
cart_decider_lock_hold_seconds_bucket{op="snapshot_capture",le="0.001"} 0
cart_decider_lock_hold_seconds_bucket{op="snapshot_capture",le="+Inf"} 1
cart_decider_lock_hold_seconds_sum{op="snapshot_capture"} 0.17
cart_decider_lock_hold_seconds_count{op="snapshot_capture"} 1
cart_decider_rejected_tickets_total 0
# TYPE cart_cp_route_seconds histogram
cart_cp_route_seconds_bucket{le="1e-05"} 50
cart_cp_route_seconds_bucket{le="0.0001"} 100
cart_cp_route_seconds_bucket{le="+Inf"} 100
cart_cp_route_seconds_sum 0.003
cart_cp_route_seconds_count 100
cart_cp_routes_total{reason="cache_hit"} 7
`

func TestParseHistograms(t *testing.T) {
	holds := ParseHistograms(exposition, "cart_decider_lock_hold_seconds")
	if len(holds) != 2 {
		t.Fatalf("series %v, want route and snapshot_capture", holds)
	}
	r := holds[`op="route"`]
	if r == nil || len(r.Bounds) != 3 || r.Bounds[0] != 1e-4 || !math.IsInf(r.Bounds[2], 1) || r.Counts[1] != 100 || r.Count != 100 || r.Sum != 0.005 {
		t.Fatalf("route series %+v", r)
	}
	dec := ParseHistograms(exposition, "cart_cp_route_seconds")
	if len(dec) != 1 || dec[""] == nil || dec[""].Count != 100 || len(dec[""].Bounds) != 3 {
		t.Fatalf("decide %v: want one unlabelled series, cart_cp_routes_total left out", dec)
	}
	if got := ParseHistograms("garbage\ncart_cp_route_seconds_bucket{le=\"x\"} 1\ncart_cp_route_seconds_bucket{le=\"1\"} nope\n", "cart_cp_route_seconds"); len(got) != 0 {
		t.Errorf("unparsable lines gave %v", got)
	}
}

func TestHistogramQuantile(t *testing.T) {
	h := &Histogram{Bounds: []float64{1, 2, math.Inf(1)}, Counts: []float64{10, 20, 20}, Count: 20}
	for _, c := range []struct{ q, want float64 }{{0.5, 1}, {0.75, 1.5}, {0.25, 0.5}, {1, 2}} {
		if got := h.Quantile(c.q); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("q%.2f = %v, want %v", c.q, got, c.want)
		}
	}
	over := &Histogram{Bounds: []float64{1, 2, math.Inf(1)}, Counts: []float64{0, 0, 3}, Count: 3}
	if got := over.Quantile(0.99); got != 2 {
		t.Errorf("a quantile in +Inf = %v, want the last finite bound", got)
	}
	if !math.IsNaN((&Histogram{Bounds: []float64{1}, Counts: []float64{0}}).Quantile(0.5)) || !math.IsNaN((*Histogram)(nil).Quantile(0.5)) {
		t.Error("an empty histogram has no quantile")
	}
	if h.Beyond(0.99) || !over.Beyond(0.5) || (*Histogram)(nil).Beyond(0.5) {
		t.Error("Beyond: only a quantile in the +Inf bucket lies beyond the buckets")
	}
	if got := h.MaxBound(); got != 2 {
		t.Errorf("MaxBound %v, want 2 (the +Inf bucket is empty)", got)
	}
	if got := over.MaxBound(); !math.IsInf(got, 1) {
		t.Errorf("MaxBound %v, want +Inf", got)
	}
}

func TestHistogramSubAdd(t *testing.T) {
	before := &Histogram{Bounds: []float64{1, math.Inf(1)}, Counts: []float64{5, 6}, Count: 6, Sum: 3}
	after := &Histogram{Bounds: []float64{1, math.Inf(1)}, Counts: []float64{5, 9}, Count: 9, Sum: 10}
	d := after.Sub(before)
	if d.Counts[0] != 0 || d.Counts[1] != 3 || d.Count != 3 || d.Sum != 7 {
		t.Fatalf("delta %+v", d)
	}
	if after.Counts[1] != 9 {
		t.Fatal("Sub changed its receiver")
	}
	// A restarted process counts from zero: the later scrape stands alone.
	if r := before.Sub(after); r.Count != 6 {
		t.Errorf("a counter reset gave %+v", r)
	}
	sum := d.Add(after)
	if sum.Count != 12 || sum.Counts[1] != 12 {
		t.Errorf("sum %+v", sum)
	}
	if (&Histogram{Bounds: []float64{2, math.Inf(1)}, Counts: []float64{1, 1}}).Add(after) != nil {
		t.Error("adding differently bucketed series must fail")
	}
	var none *Histogram
	if none.Add(d) != d {
		t.Error("nil + h is h")
	}
}

func TestSummarizeCP(t *testing.T) {
	var samples []cpSample
	for i := range 100 {
		samples = append(samples, cpSample{lat: time.Duration(i+1) * time.Millisecond})
	}
	samples = append(samples, cpSample{lat: 20 * time.Millisecond, fallback: true}, cpSample{lat: time.Millisecond, err: true})
	parse := func(text string) cpScrape {
		return cpScrape{decide: ParseHistograms(text, "cart_cp_route_seconds")[""], holds: ParseHistograms(text, "cart_decider_lock_hold_seconds")}
	}
	before := parse("")
	before.self, before.nodes = time.Second, []time.Duration{time.Second, time.Second, time.Second}
	after := parse(exposition)
	after.self, after.nodes = time.Second+100*time.Millisecond, []time.Duration{time.Second + 50*time.Millisecond, time.Second + 20*time.Millisecond, time.Second + 10*time.Millisecond}
	before.index = map[string]float64{"cart_cp_index_skipped_inserts_total": 10}
	after.index = map[string]float64{"cart_cp_index_skipped_inserts_total": 30, "cart_cp_index_evictions_total": 400}
	streams := func(inMsgs, inItems, outMsgs, outItems int) map[string]float64 {
		return ParseCounters(fmt.Sprintf(`cart_cp_stream_messages_total{direction="received"} %d
cart_cp_stream_messages_total{direction="sent"} %d
cart_cp_stream_items_total{direction="received"} %d
cart_cp_stream_items_total{direction="sent"} %d
`, inMsgs, outMsgs, inItems, outItems), cpStreamCounters)
	}
	before.stream, after.stream = streams(10, 10, 10, 10), streams(110, 160, 90, 170)
	var r CPRun
	summarizeCP(&r, samples, 2*time.Second, before, after, 1)
	// 100 messages carrying 150 calls in, 80 carrying 160 out, over 2 s of
	// 50 answered routes a second.
	if got, want := streamLine(r), "1.50 calls a message in, 2.00 answers or feed frames a message out; per answered route 1.00 messages in and 0.80 out"; got != want {
		t.Errorf("stream line %q, want %q", got, want)
	}
	if r.IndexPerS["cart_cp_index_skipped_inserts_total"] != 10 || r.IndexPerS["cart_cp_index_evictions_total"] != 200 || r.BatchPerS != nil {
		t.Errorf("per second: index %v, batch %v", r.IndexPerS, r.BatchPerS)
	}
	summarizeFallbackWindows(&r, samples, nil, 20*time.Millisecond)
	if r.Sent != 102 || r.Answered != 100 || r.Fallbacks != 1 || r.Errors != 1 || r.RoutesPerS != 50 {
		t.Fatalf("counts %+v", r)
	}
	if r.LatencyMs.P50 < 50 || r.LatencyMs.P50 > 51 || r.LatencyMs.Max != 100 {
		t.Errorf("answered latency %+v", r.LatencyMs)
	}
	if r.AllLatencyMs == r.LatencyMs {
		t.Error("all-call latency should include the fallback")
	}
	// CPU per answered route: node 1 (leader) 20 ms / 100, followers 60 ms.
	if r.CPULeaderUs != 200 || r.CPUFollowersUs != 600 || r.CPUBenchUs != 1000 {
		t.Errorf("CPU µs/route %v / %v / %v", r.CPULeaderUs, r.CPUFollowersUs, r.CPUBenchUs)
	}
	if r.DecideP99Us < 90 || r.DecideP99Us > 100 {
		t.Errorf("decide p99 %v µs, want within the 10-100 µs bucket", r.DecideP99Us)
	}
	// 100 route holds ≤ 1 ms and one snapshot capture past the buckets:
	// the p99 stays in the route buckets, the maximum is flagged.
	if r.LockHoldP99Us <= 100 || r.LockHoldP99Us > 1000 || r.LockHoldP99Beyond || !r.LockHoldOverflow || r.LockHoldMaxUs != 1000 || r.DecideP99Beyond {
		t.Errorf("lock hold p99 %v, max %v overflow %v", r.LockHoldP99Us, r.LockHoldMaxUs, r.LockHoldOverflow)
	}
	if len(r.LockHoldP99ByOpUs) != 2 || r.LockHoldP99ByOpUs["snapshot_capture"] != 1000 {
		t.Errorf("by op %v", r.LockHoldP99ByOpUs)
	}
	// The longest hold by op: route's within 1 ms, the capture past the
	// last bucket (-1), and only the capture listed as over 1 ms.
	if r.LockHoldMaxByOpUs["route"] != 1000 || r.LockHoldMaxByOpUs["snapshot_capture"] != -1 {
		t.Errorf("max by op %v", r.LockHoldMaxByOpUs)
	}
	if notes := lockHoldByOp(CPResult{Runs: []CPRun{r}}); !strings.Contains(notes, "over 1 ms, : snapshot_capture > 100 ms\n") {
		t.Errorf("notes %q", notes)
	}
	if _, err := json.Marshal(r); err != nil {
		t.Errorf("not JSON: %v", err)
	}
	if r.FallbackWindows != 1 || r.FallbackWindowMax != 1 {
		t.Errorf("one fallback: %d windows, %d at most", r.FallbackWindows, r.FallbackWindowMax)
	}
	var empty CPRun
	summarizeCP(&empty, nil, time.Second, cpScrape{}, cpScrape{}, -1)
	if _, err := json.Marshal(empty); err != nil || empty.DecideP99Us != 0 || streamLine(empty) != "" {
		t.Errorf("a run without data: %+v %v", empty, err)
	}
}

// The leader's scheduling latency over a run comes from the difference of
// two scrapes of go_sched_latencies_seconds.
func TestLeaderSchedLatency(t *testing.T) {
	scrape := func(le1, le2, inf float64) cpScrape {
		text := fmt.Sprintf(`# TYPE go_sched_latencies_seconds histogram
go_sched_latencies_seconds_bucket{le="1e-05"} %v
go_sched_latencies_seconds_bucket{le="0.001"} %v
go_sched_latencies_seconds_bucket{le="0.02"} %v
go_sched_latencies_seconds_bucket{le="+Inf"} %v
go_sched_latencies_seconds_sum 0
go_sched_latencies_seconds_count %v
`, le1, le2, inf, inf, inf)
		return cpScrape{sched: ParseHistograms(text, "go_sched_latencies_seconds")[""]}
	}
	// Before the run: 1,000 waits under 10 µs and one of 5-20 ms. During
	// it: 980 more under 10 µs, 5 under 1 ms, 15 of 1-20 ms.
	before, after := scrape(1000, 1000, 1001), scrape(1980, 1985, 2001)
	var r CPRun
	summarizeCP(&r, []cpSample{{lat: time.Millisecond}}, time.Second, before, after, -1)
	if r.LeaderSchedMaxUs != 20000 {
		t.Errorf("max %v µs, want the 20 ms bucket's bound", r.LeaderSchedMaxUs)
	}
	if r.LeaderSchedP99Us <= 1000 || r.LeaderSchedP99Us > 20000 {
		t.Errorf("p99 %v µs, want within the 1-20 ms bucket (1%% of the run's waits are there)", r.LeaderSchedP99Us)
	}
	if !strings.Contains(lockHoldByOp(CPResult{Runs: []CPRun{{Name: "open 5000/s", LeaderSchedP99Us: 1500, LeaderSchedMaxUs: 20000}}}),
		"- leader's goroutines waiting to run (go_sched_latencies_seconds), open 5000/s: p99 1.5 ms, max ≤ 20.0 ms") {
		t.Error("the section does not list the leader's scheduling latency")
	}
}

// Fallbacks are grouped by when their calls were sent: a stall shows as
// few windows holding many, and the table says so.
func TestFallbackWindows(t *testing.T) {
	var samples []cpSample
	fb := func(at time.Duration) {
		samples = append(samples, cpSample{lat: 20 * time.Millisecond, sent: at, fallback: true})
	}
	for i := range 30 {
		fb(2*time.Second + time.Duration(i)*time.Millisecond) // one stall: 30 calls within 30 ms
	}
	fb(5 * time.Second)
	fb(5*time.Second + 99*time.Millisecond) // same window as the previous
	fb(7*time.Second + 100*time.Millisecond)
	samples = append(samples, cpSample{lat: time.Millisecond, sent: 3 * time.Second}) // answered: not counted
	var r CPRun
	summarizeCP(&r, samples, 10*time.Second, cpScrape{}, cpScrape{}, -1)
	summarizeFallbackWindows(&r, samples, nil, 20*time.Millisecond)
	if r.Fallbacks != 33 || r.FallbackWindows != 3 || r.FallbackWindowMax != 30 {
		t.Fatalf("%d fallbacks in %d windows, at most %d: want 33 in 3, at most 30", r.Fallbacks, r.FallbackWindows, r.FallbackWindowMax)
	}
	r.FallbackCauses = map[string]int{"timeout": 33}
	if got, want := fallbacksCell(r), "33 (timeout 33) in 3 × 100ms, ≤ 30 in one"; got != want {
		t.Errorf("cell %q, want %q", got, want)
	}
	if got := fallbacksCell(CPRun{}); got != "0" {
		t.Errorf("no fallback: cell %q", got)
	}
}

// --block-chars reaches the nodes' config, the data planes and the
// workload alike: a mismatch would measure a cache-blind cluster.
func TestCPBlockChars(t *testing.T) {
	c := DefaultCPConfig()
	if got, want := c.blockChars(), config.Default().Cache.BlockChars; got != want {
		t.Errorf("default: %d, want the config default %d", got, want)
	}
	if spec := c.clusterSpec(); strings.Contains(CartConfig(spec.Base), "block_chars") {
		t.Errorf("default: the nodes' config sets block_chars:\n%s", CartConfig(spec.Base))
	}
	c.BlockChars = 256
	if got := c.blockChars(); got != 256 {
		t.Errorf("set: %d", got)
	}
	if conf := CartConfig(c.clusterSpec().Base); !strings.Contains(conf, "block_chars: 256\n") {
		t.Errorf("set: the nodes' config lacks block_chars 256:\n%s", conf)
	}
	if !strings.Contains(cpIntro(CPResult{Config: c}), "cache.block_chars 256") {
		t.Error("the section's intro does not say the block size")
	}
}

// --placement-batch-ms reaches every node's config and the section's intro.
func TestCPPlacementBatch(t *testing.T) {
	c := DefaultCPConfig()
	if conf := CartConfig(c.clusterSpec().Base); strings.Contains(conf, "placement_batch_ms") {
		t.Errorf("default: the nodes' config sets placement_batch_ms:\n%s", conf)
	}
	c.PlacementBatchMs = 25
	spec := c.clusterSpec()
	spec.Base.NodeID, spec.Base.DataDir = "cp1", "/tmp/cp1"
	if conf := CartConfig(spec.Base); !strings.Contains(conf, "\n  placement_batch_ms: 25\n") {
		t.Errorf("set: the nodes' config lacks placement_batch_ms 25:\n%s", conf)
	}
	if !strings.Contains(cpIntro(CPResult{Config: c}), "controlplane.placement_batch_ms 25") {
		t.Error("the section's intro does not say the batch interval")
	}
}

func TestCPLevelsAndValidate(t *testing.T) {
	var names []string
	for _, l := range cpLevels(CPConfig{Rates: []int{5000, 1000, 0, 2000}, Concurrency: []int{32}}) {
		names = append(names, l.name)
	}
	if got := strings.Join(names, ","); got != "open 1000/s,open 2000/s,closed c=32,open 5000/s" {
		t.Errorf("order %s: the highest rate goes last", got)
	}
	if err := DefaultCPConfig().Validate(); err != nil {
		t.Errorf("default: %v", err)
	}
	for name, c := range map[string]CPConfig{
		"no run":        {Duration: time.Second, DataPlanes: 1},
		"zero duration": {Rates: []int{1}, DataPlanes: 1},
		"rate":          {Rates: []int{-1, 5}, Duration: time.Second, DataPlanes: 1},
		"dataplanes":    {Rates: []int{5}, Duration: time.Second},
		"timeout":       {Rates: []int{5}, Duration: time.Second, DataPlanes: 1, RouteTimeout: -1},
		"block chars":   {Rates: []int{5}, Duration: time.Second, DataPlanes: 1, BlockChars: -1},
		"block chars+":  {Rates: []int{5}, Duration: time.Second, DataPlanes: 1, BlockChars: 65537},
		"batch":         {Rates: []int{5}, Duration: time.Second, DataPlanes: 1, PlacementBatchMs: -1},
		"procs":         {Rates: []int{5}, Duration: time.Second, DataPlanes: 1, NodeProcs: -1},
		"procs+":        {Rates: []int{5}, Duration: time.Second, DataPlanes: 1, NodeProcs: maxNodeProcs + 1},
		"warm-up":       {Rates: []int{5}, Duration: time.Second, DataPlanes: 1, Warmup: -1},
	} {
		if c.Validate() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := DefaultFailoverConfig().Validate(); err != nil {
		t.Errorf("default failover: %v", err)
	}
	bad := DefaultFailoverConfig()
	bad.Window = 0
	if bad.Validate() == nil {
		t.Error("failover with no window accepted")
	}
	bad = DefaultFailoverConfig()
	bad.NodeProcs = -1
	if bad.Validate() == nil {
		t.Error("failover with negative node procs accepted")
	}
}

// --node-procs reaches the nodes' environment (and only theirs) and the
// sections' intros; 0 leaves Go's default.
func TestCPNodeProcs(t *testing.T) {
	c := DefaultCPConfig()
	if c.NodeProcs != DefaultNodeProcs || DefaultFailoverConfig().NodeProcs != DefaultNodeProcs {
		t.Fatalf("defaults: cp %d, failover %d, want %d", c.NodeProcs, DefaultFailoverConfig().NodeProcs, DefaultNodeProcs)
	}
	if got := procsEnv(c.clusterSpec().Procs); len(got) != 1 || got[0] != "GOMAXPROCS=1" {
		t.Errorf("default: node environment %q", got)
	}
	if !strings.Contains(cpIntro(CPResult{Config: c}), "GOMAXPROCS 1 each") {
		t.Error("the cp intro does not say the nodes' GOMAXPROCS")
	}
	f := DefaultFailoverConfig()
	f.NodeProcs = 3
	if !strings.Contains(failoverIntro(FailoverResult{Config: f}), "GOMAXPROCS 3 each") {
		t.Error("the failover intro does not say the nodes' GOMAXPROCS")
	}
	c.NodeProcs = 0
	if got := procsEnv(c.clusterSpec().Procs); len(got) != 1 || got[0] != "GOMAXPROCS=" {
		t.Errorf("0: node environment %q, want Go's default", got)
	}
	if !strings.Contains(cpIntro(CPResult{Config: c}), "Go's default") {
		t.Error("the cp intro does not say the nodes run Go's default")
	}
}

// The warm-up runs at the highest rate and the intro says so; without
// one the intro says the first runs see the index fill.
func TestCPWarmup(t *testing.T) {
	c := DefaultCPConfig()
	if got := c.warmupRate(); got != 5000 {
		t.Errorf("warm-up rate %d, want the highest rate 5000", got)
	}
	if !strings.Contains(cpIntro(CPResult{Config: c}), "after a 10s warm-up at 5000/s") {
		t.Errorf("the intro does not say the warm-up: %s", cpIntro(CPResult{Config: c}))
	}
	c.Rates, c.Warmup = nil, 0
	if got := c.warmupRate(); got != 2000 {
		t.Errorf("closed loop only: warm-up rate %d, want 2000", got)
	}
	if !strings.Contains(cpIntro(CPResult{Config: c}), "the first runs see the index fill") {
		t.Error("without a warm-up the intro does not say the index fills during the runs")
	}
}

// StartEnv adds to the bench's environment rather than replacing it.
func TestStartEnvAddsToTheEnvironment(t *testing.T) {
	t.Setenv("CART_BENCH_INHERITED", "yes")
	env, err := NewEnv(SuiteConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	p, err := env.StartEnv("env", "/bin/sh", []string{"GOMAXPROCS=7"}, "-c", "echo procs=$GOMAXPROCS inherited=$CART_BENCH_INHERITED")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatal("sh did not exit")
	}
	out, err := os.ReadFile(p.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != "procs=7 inherited=yes" {
		t.Errorf("child saw %q", got)
	}
}

func TestSummarizeFailover(t *testing.T) {
	kill := time.Unix(1000, 0)
	window := 6 * time.Second
	at := func(s float64) time.Time { return kill.Add(time.Duration(s * float64(time.Second))) }
	rec := func(start, took float64, fallback, hit bool) foRecord {
		return foRecord{start: at(start), end: at(start + took), fallback: fallback, repeat: true, hit: hit, answeredByControlPlane: !fallback}
	}
	records := []foRecord{
		rec(-20, 0.01, false, true), // before the steady window: ignored
		rec(-5, 0.01, false, true), rec(-4, 0.01, false, true), rec(-3, 0.01, false, true), rec(-2, 0.01, false, false),
		// A call sent before the kill, answered after it, is not the new
		// leader's first route.
		rec(-0.1, 0.2, false, true),
		rec(0.5, 0.02, true, false), rec(1, 0.02, true, true),
		rec(1.5, 0.01, false, true), rec(3, 0.01, false, true),
		{start: at(4), end: at(4.1), err: true},
		rec(7, 0.01, false, true), rec(13, 0.01, false, true), // next window, then past it
	}
	causes := []foCause{{at(-1), "timeout"}, {at(0.5), "unavailable"}, {at(1), "cp_breaker"}, {at(7), "cp_breaker"}}
	r := summarizeFailover(records, causes, kill, at(1.2), window)
	if r.Steady.Requests != 5 || r.Steady.Hits != 4 || r.Window.Requests != 5 || r.Window.Errors != 1 || r.Window.Fallbacks != 2 || r.Post.Requests != 1 {
		t.Fatalf("windows: steady %+v kill %+v next %+v", r.Steady, r.Window, r.Post)
	}
	if math.Abs(r.Steady.HitRatio()-0.8) > 1e-9 || math.Abs(r.Window.HitRatio()-0.75) > 1e-9 || math.Abs(r.Ratio-0.75/0.8) > 1e-9 {
		t.Errorf("hit ratios %v %v ratio %v", r.Steady.HitRatio(), r.Window.HitRatio(), r.Ratio)
	}
	if math.Abs(r.FirstLeaderRouteS-1.51) > 1e-6 || math.Abs(r.ElectionS-1.2) > 1e-6 {
		t.Errorf("first leader route %v, election %v", r.FirstLeaderRouteS, r.ElectionS)
	}
	if r.BeforeLeader.Requests != 3 || r.AfterLeader.Requests != 2 {
		t.Errorf("split at the first leader route: before %+v after %+v", r.BeforeLeader, r.AfterLeader)
	}
	if len(r.Causes) != 2 || r.Causes["unavailable"] != 1 || r.Causes["cp_breaker"] != 1 {
		t.Errorf("causes in the kill window %v", r.Causes)
	}
	none := summarizeFailover(records[:5], nil, kill, time.Time{}, window)
	if none.ElectionS != -1 || none.FirstLeaderRouteS != -1 || none.Ratio != 0 {
		t.Errorf("no leader, no kill-window data: %+v", none)
	}
}

func TestReportControlPlaneSections(t *testing.T) {
	dir := t.TempDir()
	res := &SuiteResults{StartedAt: time.Now(), FinishedAt: time.Now(), Config: DefaultSuiteConfig("/repo"),
		ControlPlane: &CPResult{Config: DefaultCPConfig(), Runs: []CPRun{
			{Name: "open 1000/s", RoutesPerS: 998, LatencyMs: Latency{P50: 1.1, P90: 3, P99: 17.25}, DecideP99Us: 150, LockHoldP99Us: 80, LockHoldMaxUs: 1000,
				CPULeaderUs: 170, CPUFollowersUs: 80, CPUBenchUs: 120, Fallbacks: 3, FallbackCauses: map[string]int{"timeout": 3}, Leader: "cp1", LeaderAfter: "cp1",
				LockHoldP99ByOpUs: map[string]float64{"route": 40, "apply_batch": 900}},
			{Name: "open 5000/s", RoutesPerS: 4000, StepDowns: 1, DecideP99Us: 10000, DecideP99Beyond: true, Leader: "cp1", LeaderAfter: "cp2", LockHoldP99Us: 900, LockHoldMaxUs: 100000, LockHoldOverflow: true,
				Note: "leader changed during the run"},
		}},
		Failover: &FailoverResult{Config: DefaultFailoverConfig(), Runs: []FailoverRun{{Killed: "cp1", Ratio: 0.953,
			Steady: FailoverWindow{Requests: 100, Repeats: 100, Hits: 80}, Window: FailoverWindow{Requests: 100, Repeats: 100, Hits: 76, Fallbacks: 30},
			ElectionS: 1.2, FirstLeaderRouteS: -1, Causes: map[string]int{"cp_breaker": 30}}}},
	}
	if err := WriteReport(dir, res); err != nil {
		t.Fatal(err)
	}
	md, _ := os.ReadFile(filepath.Join(dir, "summary.md"))
	for _, want := range []string{
		"## Control plane", "| open 1000/s | 998 | 1.10 ms | 3.00 ms | 17 ms | 150 µs | 80 µs / ≤ 1.0 ms | 170 / 80 / 120 | 3 (timeout 3) | 0 | 0 |",
		"900 µs / > 100.0 ms", "| ≥ 10.0 ms |", "1 (cp1 → cp2)", "apply_batch 900 µs, route 40 µs", "- open 5000/s: leader changed during the run",
		"## Failover", "| 1 (killed cp1) | 80.0% (100 req, 0% fallback) | 76.0% (100 req, 30% fallback) | 0.953 | 0 | 1.20 s | none in window |",
		"30 (cp_breaker 30)",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("summary.md lacks %q:\n%s", want, md)
		}
	}
	var back SuiteResults
	b, _ := os.ReadFile(filepath.Join(dir, "results.json"))
	if err := json.Unmarshal(b, &back); err != nil || back.ControlPlane == nil || len(back.ControlPlane.Runs) != 2 || back.Failover == nil || back.Failover.Runs[0].Ratio != 0.953 {
		t.Errorf("results.json round trip: %v %+v", err, back.ControlPlane)
	}

	skipped := mdSection("Failover", "no leader | ever", "intro", table{}, "")
	if !strings.Contains(skipped, "Skipped: no leader \\| ever") || strings.Contains(skipped, "intro") {
		t.Errorf("skipped section %q", skipped)
	}
}

// The failover cluster's nodes run with the workload's block size, balance
// threshold and modelled cache capacity: the config must carry them.
func TestFailoverNodeConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cp.yaml")
	c := CartRouterConfig{Workers: []string{"http://127.0.0.1:1"}, CacheTokens: 288, BlockChars: failoverBlockChars, BalanceAbs: 4,
		NodeID: "cp1", APIAddr: "127.0.0.1:7001", RaftAddr: "127.0.0.1:7002", DataDir: filepath.Join(t.TempDir(), "d"), Bootstrap: true}
	if err := os.WriteFile(path, []byte(CartConfig(c)), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err == nil {
		err = cfg.Validate(config.RoleControlPlane)
	}
	if err != nil {
		t.Fatalf("%v\n%s", err, CartConfig(c))
	}
	if cfg.Cache.BlockChars != failoverBlockChars || cfg.Cache.BalanceAbsThreshold != 4 || cfg.Workers[0].CacheCapacityTokens != 288 {
		t.Errorf("cache %+v, worker %+v", cfg.Cache, cfg.Workers[0])
	}
}

// A fallback window is put down to the bench's own stall when the stall
// could have held the answers of calls sent in it: from a route timeout
// before the stall to its end.
func TestAttributeStalls(t *testing.T) {
	fb := func(at time.Duration) cpSample { return cpSample{sent: at, fallback: true} }
	samples := []cpSample{
		fb(1050 * time.Millisecond), // window 10: a stall at 1.12 s, 20 ms timeout, reaches back to 1.10 s only
		fb(2010 * time.Millisecond), // window 20: stall at 2.09 s
		fb(2020 * time.Millisecond), // same window
		fb(3150 * time.Millisecond), // window 31: the stall at 3.05 s lasts 60 ms, into it
		fb(5000 * time.Millisecond), // window 50: nothing near
		{sent: 7 * time.Second},     // answered: not a fallback window
	}
	stalls := []stall{
		{at: 1120 * time.Millisecond, late: 15 * time.Millisecond},
		{at: 2090 * time.Millisecond, late: 12 * time.Millisecond},
		{at: 3050 * time.Millisecond, late: 60 * time.Millisecond},
		{at: 7 * time.Second, late: 40 * time.Millisecond},
	}
	var r CPRun
	summarizeFallbackWindows(&r, samples, stalls, 20*time.Millisecond)
	if r.BenchStalls != 4 || r.BenchStallMaxMs != 60 {
		t.Errorf("stalls %d, max %v ms: want 4 and 60", r.BenchStalls, r.BenchStallMaxMs)
	}
	// Window 10 ends at 1.10 s, where the first stall's reach begins:
	// not overlapping. Windows 20 and 31 are explained, 50 is not.
	if r.FallbackWindowsInBenchStalls != 2 {
		t.Errorf("%d fallback windows put down to the bench, want 2", r.FallbackWindowsInBenchStalls)
	}
	r.Fallbacks, r.FallbackWindows, r.FallbackWindowMax = 5, 4, 2
	if got := fallbacksCell(r); !strings.Contains(got, "; 2 of those during the bench's own stalls (4 ≥ 10ms, max 60 ms)") {
		t.Errorf("cell %q", got)
	}
}

func TestStallWatchStops(t *testing.T) {
	w := watchStalls()
	time.Sleep(5 * time.Millisecond)
	stalls := w.Stop()
	select {
	case <-w.done:
	default:
		t.Error("Stop returned with the watch's goroutine still running")
	}
	for _, s := range stalls {
		if s.late < stallMin {
			t.Errorf("recorded a wake-up only %s late", s.late)
		}
	}
}

// A wake-up that the clock says came 25 ms after its 1 ms wait began is a
// stall of 24 ms, recorded at when the wait began; on-time ones are not.
func TestStallWatchRecordsALateWakeUp(t *testing.T) {
	base := time.Unix(1000, 0)
	var mu sync.Mutex
	reads := 0
	// Reads: the start, then (began, woke) pairs: the first wait on time,
	// the second 25 ms long, then on time again.
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		reads++
		switch {
		case reads <= 2: // start, first began
			return base
		case reads == 3: // first woke: on time
			return base.Add(stallPeriod)
		case reads == 4: // second began
			return base.Add(5 * time.Millisecond)
		case reads == 5: // second woke, 25 ms later
			return base.Add(30 * time.Millisecond)
		}
		return base.Add(30*time.Millisecond + time.Duration(reads)*stallPeriod/2) // on time from here
	}
	w := watchStallsBy(clock)
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := reads
		mu.Unlock()
		if n > 8 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	stalls := w.Stop()
	if len(stalls) != 1 || stalls[0].at != 5*time.Millisecond || stalls[0].late != 24*time.Millisecond {
		t.Fatalf("stalls %+v, want one of 24 ms at 5 ms", stalls)
	}
}
