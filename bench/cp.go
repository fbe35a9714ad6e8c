package bench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/index"
	"github.com/cartrouter/cart/dataplane/remote"
	"github.com/cartrouter/cart/dataplane/router"
)

// CPConfig is the control-plane benchmark: a real three-node control plane
// (`cart controlplane` processes) driven with Route and Complete by
// in-process data planes, open loop at fixed rates and closed loop.
type CPConfig struct {
	Rates       []int         `json:"rates"`       // open-loop runs, routes/s
	Concurrency []int         `json:"concurrency"` // closed-loop runs, clients
	Duration    time.Duration `json:"duration_ns"` // of each run
	Nodes       int           `json:"nodes"`
	DataPlanes  int           `json:"dataplanes"`
	Workers     int           `json:"workers"`
	// RouteTimeout is the data planes' Route deadline (0: the config
	// default, as in production): slower answers fall back locally.
	RouteTimeout time.Duration `json:"route_timeout_ns"`
	// Unary makes the data planes call Route, Complete and Sync one call
	// at a time instead of on the stream (dataplane.route_stream: false).
	Unary bool `json:"unary,omitempty"`
	// NoPlacementFeed turns off dataplane.route_stream_placement_feed.
	NoPlacementFeed bool `json:"no_placement_feed,omitempty"`
	// BlockChars sets cache.block_chars on every control-plane node and
	// data plane (0: the config default), for the block-size study.
	BlockChars int `json:"block_chars,omitempty"`
	// PlacementBatchMs sets controlplane.placement_batch_ms on every node
	// (0: the config default).
	PlacementBatchMs int `json:"placement_batch_ms,omitempty"`
	// NodeProcs is each node's GOMAXPROCS; 0 leaves Go's default (every
	// CPU). See DefaultNodeProcs.
	NodeProcs int `json:"node_procs"`
	// Warmup is load before the first measured run, at the highest rate,
	// so that the runs see the index full and the heap at its size, as a
	// control plane is after its first minute (0: a 1 s warm-up of
	// connections only, and the first runs see the index fill).
	Warmup       time.Duration `json:"warmup_ns"`
	StartTimeout time.Duration `json:"start_timeout_ns"`
}

// DefaultNodeProcs is the GOMAXPROCS the benches give each control-plane
// node, as the compose file does for nodes sharing one host. Three nodes
// and the load generator share this machine's two cores; with two Ps
// each (what the Helm chart gives a node with its two CPUs of request,
// which this machine cannot give three) a leader whose Ps outnumber its
// share of the CPU spends it on scheduler and lock hand-offs between its
// own threads (bench/results/2026-12-02-procs), though it misses fewer
// route deadlines (-procs2): --node-procs 2 measures that.
const DefaultNodeProcs = 1

// maxNodeProcs bounds --node-procs: more Ps than any machine here has
// cores is a typo.
const maxNodeProcs = 1024

// DefaultCPConfig is sized so the section takes under two minutes: a 10 s
// warm-up, four runs of 10 s, the cluster's start and the pauses between
// runs.
func DefaultCPConfig() CPConfig {
	return CPConfig{Rates: []int{1000, 2000, 5000}, Concurrency: []int{32}, Duration: 10 * time.Second,
		Nodes: 3, DataPlanes: 4, Workers: 4, NodeProcs: DefaultNodeProcs, Warmup: 10 * time.Second, StartTimeout: 30 * time.Second}
}

// CPRun is one load level.
type CPRun struct {
	Name        string  `json:"name"` // open-1000, closed-32
	Rate        int     `json:"rate,omitempty"`
	Concurrency int     `json:"concurrency,omitempty"`
	WallS       float64 `json:"wall_s"`
	// Sent Route calls; Answered by the control plane; Fallbacks routed
	// locally by a data plane (timeout, breaker, unreachable); Errors
	// returned to the caller (no worker at all).
	Sent           int            `json:"sent"`
	Answered       int            `json:"answered"`
	Fallbacks      int            `json:"fallbacks"`
	FallbackCauses map[string]int `json:"fallback_causes,omitempty"`
	// FallbackWindows is how many fallbackWindow-long stretches of the run
	// (by when the call was sent) had a fallback, and FallbackWindowMax
	// the most fallbacks in one: a few windows holding them all is a
	// stall, many windows with one each a steady tail.
	FallbackWindows   int `json:"fallback_windows,omitempty"`
	FallbackWindowMax int `json:"fallback_window_max,omitempty"`
	// BenchStalls counts the bench process's own stalls (a goroutine woken
	// stallMin or more late), BenchStallMaxMs the longest, and
	// FallbackWindowsInBenchStalls the fallback windows one of them
	// overlaps (see attributeStalls).
	BenchStalls                  int     `json:"bench_stalls,omitempty"`
	BenchStallMaxMs              float64 `json:"bench_stall_max_ms,omitempty"`
	FallbackWindowsInBenchStalls int     `json:"fallback_windows_in_bench_stalls,omitempty"`
	Errors                       int     `json:"errors"`
	// RoutesPerS counts the calls the control plane answered: a fallback
	// is the data plane's decision, and with the breaker open it costs
	// nothing, so counting it would reward an overloaded leader.
	RoutesPerS float64 `json:"routes_per_s"`
	// LatencyMs is the data plane's view of the answered Route calls;
	// AllLatencyMs of every routed call, fallbacks included (a timeout ends
	// at the route timeout, a breaker fallback at once).
	LatencyMs    Latency `json:"latency_ms"`
	AllLatencyMs Latency `json:"all_latency_ms"`
	// DecideP99Us is the leader's cart_cp_route_seconds over the run;
	// LockHoldP99Us its cart_decider_lock_hold_seconds over every op, and
	// LockHoldMaxUs the upper bound of the highest bucket any hold reached
	// (LockHoldOverflow: past the last finite bucket). A p99 past the last
	// finite bucket is that bound, flagged by its *Beyond.
	DecideP99Us       float64            `json:"decide_p99_us"`
	DecideP99Beyond   bool               `json:"decide_p99_beyond_buckets,omitempty"`
	LockHoldP99Us     float64            `json:"lock_hold_p99_us"`
	LockHoldP99Beyond bool               `json:"lock_hold_p99_beyond_buckets,omitempty"`
	LockHoldMaxUs     float64            `json:"lock_hold_max_us"`
	LockHoldOverflow  bool               `json:"lock_hold_overflow,omitempty"`
	LockHoldP99ByOpUs map[string]float64 `json:"lock_hold_p99_by_op_us,omitempty"`
	// LockHoldMaxByOpUs is, by op, the upper bound of the highest bucket
	// a hold reached (-1 past the last finite one): which op held the lock
	// longest.
	LockHoldMaxByOpUs map[string]float64 `json:"lock_hold_max_by_op_us,omitempty"`
	// LockWaitP99ByOpUs is the leader's cart_decider_lock_wait_seconds
	// p99 by op: how long each kind of holder waited to take the lock
	// (for a decision, part of its decide time).
	LockWaitP99ByOpUs map[string]float64 `json:"lock_wait_p99_by_op_us,omitempty"`
	// LeaderSchedP99Us and LeaderSchedMaxUs are how long the leader's
	// goroutines waited to run over the run (go_sched_latencies_seconds;
	// the max is the upper bound of the highest bucket used).
	LeaderSchedP99Us float64 `json:"leader_sched_p99_us,omitempty"`
	LeaderSchedMaxUs float64 `json:"leader_sched_max_us,omitempty"`
	// CPU per answered call, µs: the leader, both followers together, and
	// the bench process (load generator and data planes).
	CPULeaderUs    float64 `json:"cpu_leader_us_per_route"`
	CPUFollowersUs float64 `json:"cpu_followers_us_per_route"`
	CPUBenchUs     float64 `json:"cpu_bench_us_per_route"`
	// Leader and LeaderAfter name the leader before and after the run;
	// StepDowns is the number of terms that passed (each an election).
	Leader      string `json:"leader"`
	LeaderAfter string `json:"leader_after"`
	StepDowns   int    `json:"step_downs"`
	LoadAvg     string `json:"loadavg"`
	Note        string `json:"note,omitempty"`
	// BatchPerS is what the leader's placement batches carried per second
	// of the run (its cart_cp_batch* and cart_cp_touches_total counters,
	// keyed by sample name): the log's cost on every node.
	BatchPerS map[string]float64 `json:"batch_per_s,omitempty"`
	// IndexPerS is what the leader's prefix index evicted and skipped per
	// second of the run, and the eviction passes its size asked for: an
	// index that skips is not learning the new prompts.
	IndexPerS map[string]float64 `json:"index_per_s,omitempty"`
	// StreamPerS is the leader's Route-stream messages and the calls,
	// answers and feed frames they carried, per second of the run (its
	// cart_cp_stream_{messages,items}_total, keyed by sample): the
	// leader's cost per route is mostly per message.
	StreamPerS map[string]float64 `json:"stream_per_s,omitempty"`
}

// cpBatchCounters are the leader's counters BatchPerS reports.
var cpBatchCounters = []string{"cart_cp_batches_proposed_total", "cart_cp_batch_records_total", "cart_cp_batch_blocks_total", "cart_cp_touches_total"}

// cpIndexCounters are the leader's counters IndexPerS reports.
var cpIndexCounters = []string{"cart_cp_index_evictions_total", "cart_cp_index_skipped_inserts_total", "cart_decider_pressure_passes_total"}

// cpStreamCounters are the leader's counters StreamPerS reports.
var cpStreamCounters = []string{"cart_cp_stream_messages_total", "cart_cp_stream_items_total"}

// CPResult is the control-plane section.
type CPResult struct {
	Config  CPConfig `json:"config"`
	Runs    []CPRun  `json:"runs"`
	Skipped string   `json:"skipped,omitempty"`
	LoadAvg string   `json:"loadavg"`
}

// cpWorkload yields Route requests for prompts of 2.5k-10k characters,
// each starting with one of 100 shared 2k-character group prefixes (a
// system prompt) and going on with a unique suffix: every request is a new
// prompt that shares a prefix, so the leader matches and places on every
// call. Prefix hashes come from index.Hash over real text; the suffix is a
// chain of unique hashes (the control plane only sees hashes, and hashing
// 6 kB of text per request would cost the load generator more than the
// server).
type cpWorkload struct {
	model      string
	blockChars int
	prefixes   [][]uint64
	salt       uint64
	seq        atomic.Uint64
}

const (
	cpGroups      = 100
	cpPrefixChars = 2048
	cpMinChars    = 2500
	cpMaxChars    = 10000
	cpModel       = "bench-model"
	// cpUndelivered: one completion in this many reports "never delivered",
	// which withdraws the placement, as failed upstream attempts do.
	cpUndelivered = 100
)

func newCPWorkload(model string, blockChars int, seed uint64) *cpWorkload {
	r := rand.New(rand.NewPCG(seed, 7))
	w := &cpWorkload{model: model, blockChars: blockChars, salt: r.Uint64()}
	const letters = "abcdefghijklmnopqrstuvwxyz      ,.ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	text := make([]byte, cpPrefixChars)
	for range cpGroups {
		for i := range text {
			text[i] = letters[r.IntN(len(letters))]
		}
		w.prefixes = append(w.prefixes, index.Hash(nil, model, text, blockChars))
	}
	return w
}

func mix64(x uint64) uint64 { // splitmix64's finaliser
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func (w *cpWorkload) next() *router.Request {
	n := w.seq.Add(1)
	r := mix64(n ^ w.salt)
	g := w.prefixes[r%cpGroups]
	keyLen := cpMinChars + int((r>>16)%(cpMaxChars-cpMinChars+1))
	hashes := make([]uint64, index.NumBlocks(keyLen, w.blockChars))
	copy(hashes, g)
	h := g[len(g)-1]
	for i := len(g); i < len(hashes); i++ {
		h = mix64(h ^ mix64(n*0x100000001b3+uint64(i)) ^ w.salt)
		hashes[i] = h
	}
	return &router.Request{ID: strconv.FormatUint(n, 36), Endpoint: "chat_completions", Model: w.model, Hashes: hashes, KeyLen: keyLen}
}

// cpSample is one Route call.
type cpSample struct {
	lat      time.Duration
	sent     time.Duration // since the run started
	fallback bool
	err      bool
}

// fallbackWindow groups a run's fallbacks by when their calls were sent.
const fallbackWindow = 100 * time.Millisecond

// fallbackWindows counts the run's fallbacks per fallbackWindow of send
// time, keyed by the window's number.
func fallbackWindows(samples []cpSample) map[time.Duration]int {
	w := map[time.Duration]int{}
	for _, s := range samples {
		if s.fallback && !s.err {
			w[s.sent/fallbackWindow]++
		}
	}
	return w
}

// causeCounter counts the data planes' fallback causes.
type causeCounter struct {
	mu sync.Mutex
	m  map[string]int
}

func (c *causeCounter) add(cause string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]int{}
	}
	c.m[cause]++
}

func (c *causeCounter) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.m
	c.m = nil
	return m
}

// decideOnce is one data-plane decision, settled at once (the Route load
// is what is measured, not the workers).
func decideOnce(ctx context.Context, r *remote.Router, req *router.Request, n uint64) cpSample {
	t0 := time.Now()
	d, err := r.Decide(ctx, req)
	s := cpSample{lat: time.Since(t0)}
	if err != nil {
		s.err = true
		return s
	}
	s.fallback = d.Reason == remote.ReasonFallbackLocal
	settle(r, d, n%cpUndelivered != 0)
	return s
}

// runOpenLoop sends rate calls/s for dur, each on its own goroutine, so a
// slow answer never delays the next send (no coordinated omission).
func runOpenLoop(ctx context.Context, dps []*remote.Router, wl *cpWorkload, rate int, dur time.Duration) ([]cpSample, time.Duration) {
	n := int(float64(rate) * dur.Seconds())
	samples := make([]cpSample, n)
	interval := time.Second / time.Duration(rate)
	var wg sync.WaitGroup
	start := time.Now()
	sent := 0
	for i := range n {
		if w := time.Until(start.Add(time.Duration(i) * interval)); w > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(w):
			}
		}
		if ctx.Err() != nil {
			break
		}
		sent++
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := decideOnce(ctx, dps[i%len(dps)], wl.next(), uint64(i))
			s.sent = time.Duration(i) * interval
			samples[i] = s
		}()
	}
	wg.Wait() // bounded: each call ends at the route timeout
	return samples[:sent], time.Since(start)
}

// runClosedLoop runs conc clients back to back for dur.
func runClosedLoop(ctx context.Context, dps []*remote.Router, wl *cpWorkload, conc int, dur time.Duration) ([]cpSample, time.Duration) {
	per := make([][]cpSample, conc)
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(dur)
	for g := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := dps[g%len(dps)]
			for i := uint64(0); time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				sent := time.Since(start)
				s := decideOnce(ctx, r, wl.next(), i)
				s.sent = sent
				per[g] = append(per[g], s)
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	var all []cpSample
	for _, s := range per {
		all = append(all, s...)
	}
	return all, wall
}

// selfCPU is the CPU time this process has used so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpScrape is what the benchmark reads around a run.
type cpScrape struct {
	self   time.Duration
	nodes  []time.Duration // CPU per node, parallel to cluster.nodes
	decide *Histogram
	sched  *Histogram
	holds  map[string]*Histogram
	waits  map[string]*Histogram
	batch  map[string]float64
	index  map[string]float64
	stream map[string]float64
}

func scrapeCP(c *cpCluster, leader *cpNode) cpScrape {
	s := cpScrape{self: selfCPU()}
	for _, n := range c.nodes {
		s.nodes = append(s.nodes, n.proc.CPUTime())
	}
	if leader != nil {
		if text, err := c.metrics(leader); err == nil {
			s.decide = ParseHistograms(text, "cart_cp_route_seconds")[""]
			s.sched = ParseHistograms(text, "go_sched_latencies_seconds")[""]
			s.holds = ParseHistograms(text, "cart_decider_lock_hold_seconds")
			s.waits = ParseHistograms(text, "cart_decider_lock_wait_seconds")
			s.batch = ParseCounters(text, cpBatchCounters)
			s.index = ParseCounters(text, cpIndexCounters)
			s.stream = ParseCounters(text, cpStreamCounters)
		}
	}
	return s
}

// summarizeCP turns a run's samples and the scrapes around it into a CPRun
// (leaderIdx: the leader's position in the node list, -1 if unknown).
func summarizeCP(r *CPRun, samples []cpSample, wall time.Duration, before, after cpScrape, leaderIdx int) {
	r.WallS = wall.Seconds()
	r.Sent = len(samples)
	var answered, every []float64
	for _, s := range samples {
		ms := float64(s.lat) / 1e6
		switch {
		case s.err:
			r.Errors++
			continue
		case s.fallback:
			r.Fallbacks++
		default:
			r.Answered++
			answered = append(answered, ms)
		}
		every = append(every, ms)
	}
	r.LatencyMs, r.AllLatencyMs = latencyOf(answered), latencyOf(every)
	if wall > 0 {
		r.RoutesPerS = float64(r.Answered) / wall.Seconds()
	}
	if r.Answered > 0 {
		per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(r.Answered) }
		r.CPUBenchUs = per(after.self - before.self)
		for i := range after.nodes {
			if i >= len(before.nodes) {
				break
			}
			if d := after.nodes[i] - before.nodes[i]; i == leaderIdx {
				r.CPULeaderUs = per(d)
			} else {
				r.CPUFollowersUs += per(d)
			}
		}
	}
	r.BatchPerS = perSecond(before.batch, after.batch, wall)
	r.IndexPerS = perSecond(before.index, after.index, wall)
	r.StreamPerS = perSecond(before.stream, after.stream, wall)
	if after.decide != nil {
		d := after.decide.Sub(before.decide)
		r.DecideP99Us, r.DecideP99Beyond = finite(1e6*d.Quantile(0.99)), d.Beyond(0.99)
	}
	if after.sched != nil {
		if d := after.sched.Sub(before.sched); d != nil && d.Count > 0 {
			r.LeaderSchedP99Us, r.LeaderSchedMaxUs = finite(1e6*d.Quantile(0.99)), finite(1e6*d.MaxBound())
		}
	}
	for op, h := range after.waits {
		d := h.Sub(before.waits[op])
		if d == nil || d.Count <= 0 {
			continue
		}
		if r.LockWaitP99ByOpUs == nil {
			r.LockWaitP99ByOpUs = map[string]float64{}
		}
		name, _ := cutLabel(op, "op")
		r.LockWaitP99ByOpUs[name] = finite(1e6 * d.Quantile(0.99))
	}
	var all *Histogram
	mismatch := false
	for op, h := range after.holds {
		d := h.Sub(before.holds[op])
		if d.Count <= 0 {
			continue
		}
		if r.LockHoldP99ByOpUs == nil {
			r.LockHoldP99ByOpUs = map[string]float64{}
		}
		name, _ := cutLabel(op, "op")
		r.LockHoldP99ByOpUs[name] = finite(1e6 * d.Quantile(0.99))
		if r.LockHoldMaxByOpUs == nil {
			r.LockHoldMaxByOpUs = map[string]float64{}
		}
		if mb := d.MaxBound(); math.IsInf(mb, 1) {
			r.LockHoldMaxByOpUs[name] = -1
		} else {
			r.LockHoldMaxByOpUs[name] = finite(1e6 * mb)
		}
		if all = all.Add(d); all == nil {
			mismatch = true
		}
	}
	if all != nil && !mismatch {
		r.LockHoldP99Us, r.LockHoldP99Beyond = finite(1e6*all.Quantile(0.99)), all.Beyond(0.99)
		mb := all.MaxBound()
		if math.IsInf(mb, 1) {
			r.LockHoldOverflow = true
			mb = all.Bounds[max(0, len(all.Bounds)-2)]
		}
		r.LockHoldMaxUs = 1e6 * mb
	}
}

// finite maps NaN (no observations) to 0, so results stay valid JSON.
// perSecond is how fast each counter grew from before to after over wall
// (nil when either scrape is missing).
func perSecond(before, after map[string]float64, wall time.Duration) map[string]float64 {
	if before == nil || len(after) == 0 || wall <= 0 {
		return nil
	}
	out := make(map[string]float64, len(after))
	for k, v := range after {
		out[k] = (v - before[k]) / wall.Seconds()
	}
	return out
}

func finite(x float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return 0
	}
	return x
}

type cpLevel struct {
	name       string
	rate, conc int
}

// cpLevels orders the runs: open-loop rates ascending, the closed loops
// before the highest rate. Overload goes last because a backlog of
// thousands of calls can cost the leader its lease, and the runs after it
// would measure the recovery.
func cpLevels(cfg CPConfig) []cpLevel {
	var rates []int
	for _, r := range cfg.Rates {
		if r > 0 {
			rates = append(rates, r)
		}
	}
	slices.Sort(rates)
	var out []cpLevel
	open := func(r int) { out = append(out, cpLevel{name: fmt.Sprintf("open %d/s", r), rate: r}) }
	for i, r := range rates {
		if i < len(rates)-1 {
			open(r)
		}
	}
	for _, c := range cfg.Concurrency {
		if c > 0 {
			out = append(out, cpLevel{name: fmt.Sprintf("closed c=%d", c), conc: c})
		}
	}
	if len(rates) > 0 {
		open(rates[len(rates)-1])
	}
	return out
}

// RunCP starts a control-plane cluster, warms it, and measures each
// configured load level in turn. A cluster that does not start is reported
// as skipped, not as an error: the suite goes on without the section.
func RunCP(ctx context.Context, env *Env, cfg CPConfig) CPResult {
	res := CPResult{Config: cfg, LoadAvg: LoadAvg()}
	bin := filepath.Join(env.Cfg.BinDir, "cart")
	blockChars := cfg.blockChars()
	cl, err := startCPCluster(ctx, env, bin, cfg.clusterSpec())
	if err != nil {
		res.Skipped = err.Error()
		return res
	}
	defer cl.close()
	causes := &causeCounter{}
	dps, err := startDataPlanes(ctx, env, max(cfg.DataPlanes, 1), max(cfg.Workers, 1), func(i int, client *http.Client) remote.Options {
		o := dataPlaneOptions(fmt.Sprintf("bench-dp-%d", i+1), cl.urls(), blockChars, 0, cfg.RouteTimeout, client, causes.add)
		o.RouteStream = o.RouteStream && !cfg.Unary
		o.PlacementFeed = o.PlacementFeed && !cfg.NoPlacementFeed
		return o
	}, cfg.StartTimeout)
	if err != nil {
		res.Skipped = "data planes: " + err.Error()
		return res
	}
	defer dps.stop()
	wl := newCPWorkload(cpModel, blockChars, uint64(time.Now().UnixNano()))
	// Warm-up: connections, the group prefixes in the index, the leader's
	// first placements replicated.
	runOpenLoop(ctx, dps.routers, wl, 500, time.Second)
	if cfg.Warmup > 0 {
		runOpenLoop(ctx, dps.routers, wl, cfg.warmupRate(), cfg.Warmup)
	}
	causes.take()
	for _, lv := range cpLevels(cfg) {
		if ctx.Err() != nil {
			break
		}
		// Let the previous run's placements and completions drain.
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
		run := CPRun{Name: lv.name, Rate: lv.rate, Concurrency: lv.conc}
		leader, term := cl.leader(ctx)
		li := -1
		if leader != nil {
			run.Leader = leader.id
			for i, n := range cl.nodes {
				if n == leader {
					li = i
				}
			}
		}
		before := scrapeCP(cl, leader)
		var samples []cpSample
		var wall time.Duration
		watch := watchStalls()
		if lv.rate > 0 {
			samples, wall = runOpenLoop(ctx, dps.routers, wl, lv.rate, cfg.Duration)
		} else {
			samples, wall = runClosedLoop(ctx, dps.routers, wl, lv.conc, cfg.Duration)
		}
		stalls := watch.Stop()
		after := scrapeCP(cl, leader)
		summarizeCP(&run, samples, wall, before, after, li)
		summarizeFallbackWindows(&run, samples, stalls, cfg.routeTimeout())
		run.FallbackCauses = causes.take()
		run.LoadAvg = LoadAvg()
		if ld, term1 := cl.leader(ctx); ld != nil {
			run.LeaderAfter = ld.id
			if term1 > term {
				run.StepDowns = int(term1 - term)
			}
		} else {
			run.LeaderAfter = "none"
			run.StepDowns = 1
		}
		if run.LeaderAfter != run.Leader {
			run.Note = "leader changed during the run: decide and lock-hold figures are the old leader's"
		}
		res.Runs = append(res.Runs, run)
		env.Logf("   %-12s %s", lv.name, cpRunLine(run))
	}
	return res
}

// blockChars is the block size the nodes run with, which the data planes
// and the workload must hash with too.
func (c CPConfig) blockChars() int {
	if c.BlockChars > 0 {
		return c.BlockChars
	}
	return config.Default().Cache.BlockChars
}

// routeTimeout is the data planes' Route deadline.
func (c CPConfig) routeTimeout() time.Duration {
	if c.RouteTimeout > 0 {
		return c.RouteTimeout
	}
	return config.Default().DataPlane.RouteTimeout()
}

// warmupRate is the highest open-loop rate, or 2,000/s without one.
func (c CPConfig) warmupRate() int {
	r := 2000
	if len(c.Rates) > 0 {
		r = max(slices.Max(c.Rates), 1)
	}
	return r
}

func (c CPConfig) clusterSpec() cpClusterSpec {
	return cpClusterSpec{Nodes: max(c.Nodes, 1), Workers: max(c.Workers, 1), Model: cpModel,
		Base: CartRouterConfig{BlockChars: c.BlockChars, PlacementBatchMs: c.PlacementBatchMs}, StartTimeout: c.StartTimeout, Procs: c.NodeProcs}
}

// ValidateNodeProcs checks NodeProcs alone: the suite's distributed
// scenarios start their nodes with it even when the section is skipped.
func (c CPConfig) ValidateNodeProcs() error { return checkNodeProcs("control-plane", c.NodeProcs) }

// checkNodeProcs refuses a GOMAXPROCS for the nodes out of 0..maxNodeProcs.
func checkNodeProcs(section string, n int) error {
	if n < 0 || n > maxNodeProcs {
		return fmt.Errorf("%s benchmark: node procs %d out of range 0..%d (0 = Go's default)", section, n, maxNodeProcs)
	}
	return nil
}

// Validate refuses settings that would measure nothing or never end.
func (c CPConfig) Validate() error {
	if len(cpLevels(c)) == 0 {
		return fmt.Errorf("control-plane benchmark: no run: give a positive rate or concurrency")
	}
	for _, r := range c.Rates {
		if r < 0 || r > 1_000_000 {
			return fmt.Errorf("control-plane benchmark: rate %d out of range 0..1000000", r)
		}
	}
	for _, n := range c.Concurrency {
		if n < 0 || n > 10_000 {
			return fmt.Errorf("control-plane benchmark: concurrency %d out of range 0..10000", n)
		}
	}
	switch {
	case c.Duration <= 0 || c.Duration > time.Hour:
		return fmt.Errorf("control-plane benchmark: duration %s out of range (0, 1h]", c.Duration)
	case c.DataPlanes < 1 || c.DataPlanes > 64:
		return fmt.Errorf("control-plane benchmark: dataplanes %d out of range 1..64", c.DataPlanes)
	case c.RouteTimeout < 0:
		return fmt.Errorf("control-plane benchmark: negative route timeout %s", c.RouteTimeout)
	case c.BlockChars < 0 || c.BlockChars > 65536:
		// cache.block_chars' own range: a node would refuse to start.
		return fmt.Errorf("control-plane benchmark: block chars %d out of range 0..65536 (0 = the config default)", c.BlockChars)
	case c.PlacementBatchMs < 0 || c.PlacementBatchMs > 60_000:
		return fmt.Errorf("control-plane benchmark: placement batch %d ms out of range 0..60000 (0 = the config default)", c.PlacementBatchMs)
	case c.Warmup < 0 || c.Warmup > 10*time.Minute:
		return fmt.Errorf("control-plane benchmark: warm-up %s out of range [0, 10m]", c.Warmup)
	}
	return c.ValidateNodeProcs()
}
