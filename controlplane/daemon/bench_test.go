package daemon_test

// Route benchmarks for the control plane. They start real `cart
// controlplane` processes (or one in-process node), drive
// RouterService.Route at fixed open-loop rates and closed-loop, and settle
// the tickets with batched Complete calls as a data plane would. They only
// run with -bench; see BENCHMARKS.md for the commands and the results.
//
//	go test -run XXX -bench 'RouteCluster3$' -benchtime 1x ./controlplane/daemon
//
// BenchmarkRouteCluster3, BenchmarkRouteSingleNode: processes on loopback.
// BenchmarkRouteInProcess: one node in this process, handler called
// directly and over its own h2c API. BenchmarkRouteInProcessLeader3: the
// leader in this process (for -cpuprofile), followers as processes.
// BenchmarkRaftLogGrowth: log entries and bytes per 100k routes.
// BenchmarkPlaceBatchApply: engine-lock hold time of one placement batch.
//
// Flags (after -args): -cartbench.dur, -cartbench.conc, -cartbench.gzip,
// -cartbench.growth, -cartbench.growthrate.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/cpclient"
	"github.com/cartrouter/cart/controlplane/daemon"
	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
	"github.com/cartrouter/cart/controlplane/state"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
	"github.com/cartrouter/cart/sim"
)

var (
	benchDur        = flag.Duration("cartbench.dur", 5*time.Second, "duration of each open-loop and closed-loop Route run")
	benchGrowth     = flag.Int("cartbench.growth", 100_000, "routes for the raft log growth measurement")
	benchGrowthRate = flag.Int("cartbench.growthrate", 0, "open-loop rate (routes/s) of the growth run; 0 = closed loop with 32 clients until -cartbench.growth routes succeeded")
	benchConc       = flag.String("cartbench.conc", "16,64", "closed-loop client goroutine counts, comma separated")
	benchGzip       = flag.Bool("cartbench.gzip", true, "clients accept gzip responses (connect's default, as data planes do); false shows the cost of compressing every response")
)

const (
	benchWorkers     = 4
	benchDataPlanes  = 4 // simulated data planes: one HTTP/2 client and one completer each
	benchGroups      = 100
	benchBlockChars  = 64 // cache.block_chars default
	benchPrefixChars = 2048
	benchMinChars    = 2500
	benchMaxChars    = 10000
	benchCallTimeout = 2 * time.Second
	benchCompleteTTL = 20 * time.Millisecond // data plane completion batching window
	benchUndelivered = 100                   // 1 in 100 completions reports "never delivered" (withdraws the placement)
	benchModel       = "bench-model"
)

// ---- workload ---------------------------------------------------------

// workload yields Route requests: prompts of 2.5k-10k characters, each
// starting with one of 100 shared 2 k-character group prefixes (a system
// prompt, a few-shot preamble) followed by a unique suffix. The prefix
// hashes come from index.Hash over real text; the suffix hashes are a
// chain of unique 64-bit values (the control plane only ever sees hashes,
// so their text does not matter, and generating 6 kB of text per request
// would cost the load generator more than the server).
type workload struct {
	prefixes [][]uint64
	salt     uint64
	seq      atomic.Uint64
}

func newWorkload() *workload {
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	w := &workload{salt: r.Uint64()}
	text := make([]byte, benchPrefixChars)
	const letters = "abcdefghijklmnopqrstuvwxyz      ,.ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	for range benchGroups {
		for i := range text {
			text[i] = letters[r.IntN(len(letters))]
		}
		w.prefixes = append(w.prefixes, index.Hash(nil, benchModel, text, benchBlockChars))
	}
	return w
}

func mix64(x uint64) uint64 { // splitmix64 finaliser
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// next returns a fresh request (a unique prompt) for data plane dp.
func (w *workload) next(dp string) *cartv1.RouteRequest {
	n := w.seq.Add(1)
	r := mix64(n ^ w.salt)
	g := w.prefixes[r%benchGroups]
	keyLen := benchMinChars + int((r>>16)%(benchMaxChars-benchMinChars+1))
	blocks := index.NumBlocks(keyLen, benchBlockChars)
	hashes := make([]uint64, blocks)
	copy(hashes, g)
	h := g[len(g)-1]
	for i := len(g); i < blocks; i++ {
		h = mix64(h ^ mix64(n*0x100000001b3+uint64(i)) ^ w.salt)
		hashes[i] = h
	}
	return &cartv1.RouteRequest{
		Endpoint:    "chat_completions",
		Model:       benchModel,
		BlockHashes: hashes,
		KeyLength:   uint32(keyLen),
		DataplaneId: dp,
		RequestId:   strconv.FormatUint(n, 36),
	}
}

// ---- targets: processes, in-process handler ----------------------------

// routerAPI is what a benchmark drives: a Connect client or the handler.
type routerAPI interface {
	Route(context.Context, *connect.Request[cartv1.RouteRequest]) (*connect.Response[cartv1.RouteResponse], error)
	Complete(context.Context, *connect.Request[cartv1.CompleteRequest]) (*connect.Response[cartv1.CompleteResponse], error)
}

// benchReplicas starts n in-process sim replicas so the prober keeps every
// worker healthy.
func benchReplicas(tb testing.TB, n int) []string {
	var urls []string
	for i := range n {
		s := sim.New(sim.Config{Name: fmt.Sprintf("w%d", i), Models: []string{benchModel}}) // the leader routes only listed models
		ts := httptest.NewServer(s.Handler())
		tb.Cleanup(func() { ts.Close(); _ = s.Close() })
		urls = append(urls, ts.URL)
	}
	return urls
}

func benchFreePort(tb testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// benchConfig writes a control-plane config with the production defaults
// for batching (placement_batch_ms 10, placement_batch_max 512), snapshots
// and the index; health probes every 2 s with a 2 s timeout (default
// thresholds), so the workers are seen healthy before the run starts.
func benchConfig(tb testing.TB, p *cpProc, bootstrap bool, join string, workers []string) {
	var sb strings.Builder
	fmt.Fprintf(&sb, "server: {min_open_files: 0}\nlog: {level: warn}\nhealth: {interval_secs: 2, timeout_secs: 2}\n")
	fmt.Fprintf(&sb, "controlplane:\n  node_id: %s\n  api_addr: %s\n  raft_addr: %s\n  data_dir: %s\n", p.id, p.api, p.raft, p.dir)
	if bootstrap {
		sb.WriteString("  bootstrap: true\nworkers:\n")
		for _, w := range workers {
			fmt.Fprintf(&sb, "  - url: %s\n", w)
		}
	} else {
		fmt.Fprintf(&sb, "  join: [%s]\n", join)
	}
	if err := os.WriteFile(p.cfg, []byte(sb.String()), 0o600); err != nil {
		tb.Fatal(err)
	}
}

// bproc is a cpProc whose output goes to a goroutine-safe buffer (the
// benchmarks read it while the process runs).
type bproc struct {
	*cpProc
	out *bytesBuffer
}

func benchStartProc(tb testing.TB, p *bproc) {
	p.out = &bytesBuffer{}
	p.cmd = exec.Command(cartBin, "controlplane", "-c", p.cfg)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
}

// benchCluster starts n `cart controlplane` processes (n = 1 or 3) and
// waits until they form a cluster with every worker healthy.
func benchCluster(tb testing.TB, n int, workers []string) (procs []*bproc, leader *bproc) {
	base := tb.TempDir()
	for i := 1; i <= n; i++ {
		procs = append(procs, &bproc{cpProc: &cpProc{id: fmt.Sprintf("n%d", i), api: benchFreePort(tb), raft: benchFreePort(tb),
			dir: filepath.Join(base, fmt.Sprintf("d%d", i)), cfg: filepath.Join(base, fmt.Sprintf("n%d.yaml", i))}})
	}
	for i, p := range procs {
		benchConfig(tb, p.cpProc, i == 0, procs[0].url(), workers)
	}
	tb.Cleanup(func() {
		for _, p := range procs {
			p.stop(syscall.SIGKILL)
		}
	})
	benchStartProc(tb, procs[0])
	if _, err := benchWaitLeader(procs[:1], 15*time.Second); err != nil {
		tb.Fatalf("%v\n%s", err, procs[0].out.String())
	}
	for _, p := range procs[1:] {
		benchStartProc(tb, p)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := status(procs[0].url())
		if err == nil && len(st.GetMembers()) == n && st.GetLeaderUrl() != "" &&
			st.GetWorkers() == uint32(len(workers)) && st.GetHealthyWorkers() == uint32(len(workers)) {
			break
		}
		if time.Now().After(deadline) {
			for _, p := range procs {
				tb.Logf("--- %s log:\n%s", p.id, p.out.String())
			}
			tb.Fatalf("cluster did not form with healthy workers: %v %v", st, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	leader, err := benchWaitLeader(procs, 15*time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	return procs, leader
}

func benchWaitLeader(procs []*bproc, within time.Duration) (*bproc, error) {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		for _, p := range procs {
			if p.cmd == nil {
				continue
			}
			if st, err := status(p.url()); err == nil && st.GetState() == "leader" {
				return p, nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil, fmt.Errorf("no leader within %v", within)
}

// dataPlanes builds the simulated data planes, each with its own HTTP/2
// (h2c) connection pool, as separate data plane processes would have.
func dataPlanesFor(url string) []*benchDP { return dataPlanesGzip(url, *benchGzip) }

// dataPlanesGzip: with gzip false the clients do not offer gzip, so the
// server answers uncompressed (connect compresses every response a client
// accepts gzip for, however small, unless the handler sets
// WithCompressMinBytes).
func dataPlanesGzip(url string, gzip bool) []*benchDP {
	var dps []*benchDP
	for i := range benchDataPlanes {
		c := cpclient.NewWithTLS(nil)
		opts := []connect.ClientOption{connect.WithGRPC()}
		if !gzip {
			opts = append(opts, connect.WithAcceptCompression("gzip", nil, nil))
		}
		dps = append(dps, &benchDP{id: fmt.Sprintf("bench-dp-%d", i), api: cartv1connect.NewRouterServiceClient(c, url, opts...)})
	}
	return dps
}

// ---- data plane: route + batched completion ----------------------------

type benchDP struct {
	id  string
	api routerAPI

	mu      sync.Mutex
	pending []*cartv1.Completion
	ndone   uint64

	completeCalls, completeErrs, settled atomic.Int64
}

func (d *benchDP) done(tk uint64, worker string) {
	d.mu.Lock()
	d.ndone++
	d.pending = append(d.pending, &cartv1.Completion{Ticket: tk, Worker: worker, Delivered: d.ndone%benchUndelivered != 0, PromptTokens: -1, CachedTokens: -1})
	d.mu.Unlock()
}

func (d *benchDP) flush() {
	d.mu.Lock()
	batch := d.pending
	d.pending = nil
	d.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), benchCallTimeout)
	defer cancel()
	d.completeCalls.Add(1)
	r, err := d.api.Complete(ctx, connect.NewRequest(&cartv1.CompleteRequest{DataplaneId: d.id, Completions: batch}))
	if err != nil {
		d.completeErrs.Add(1)
		return
	}
	d.settled.Add(int64(r.Msg.GetSettled()))
}

// completer flushes completions every benchCompleteTTL until stop, then once more.
func (d *benchDP) completer(stop <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	t := time.NewTicker(benchCompleteTTL)
	defer t.Stop()
	for {
		select {
		case <-stop:
			d.flush()
			return
		case <-t.C:
			d.flush()
		}
	}
}

// ---- measurement --------------------------------------------------------

type sample struct {
	lat      time.Duration // client-observed Route latency (call start to answer)
	sched    time.Duration // open loop: intended send time to answer
	decision int64         // server-side decision_micros
	reason   string
	err      string
}

type cpuSnap struct {
	at        time.Time
	self      time.Duration
	procs     []time.Duration
	busy, all uint64
}

var clkTck = 10 * time.Millisecond // USER_HZ = 100 on Linux

func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+2:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseUint(f[11], 10, 64)
	st, _ := strconv.ParseUint(f[12], 10, 64)
	return time.Duration(u+st) * clkTck
}

func machineCPU() (busy, all uint64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	for i, x := range f[1:min(len(f), 9)] { // user..steal; guest time is already in user
		v, _ := strconv.ParseUint(x, 10, 64)
		all += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, all
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func snapCPU(pids []int) cpuSnap {
	s := cpuSnap{at: time.Now(), self: selfCPU()}
	for _, p := range pids {
		s.procs = append(s.procs, procCPU(p))
	}
	s.busy, s.all = machineCPU()
	return s
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

type result struct {
	name      string
	target    string // "1000/s", "closed c=16"
	sent, ok  int
	errs      map[string]int
	wall      time.Duration
	rps       float64
	p50, p90  time.Duration
	p99, pmax time.Duration
	schedP99  time.Duration // open loop: from intended send time
	decP50    int64
	decP99    int64
	reasons   map[string]int
	// CPU per successful route, µs: leader process, followers (sum),
	// benchmark process (clients + sims, or everything in-process).
	cpuLeader, cpuFollowers, cpuClient float64
	machineBusy                        float64 // % of all cores, whole machine
	load                               string
	completeCalls, completeErrs        int64
	settled                            int64
	gomaxprocs                         int
	others                             float64 // machine busy % not accounted to the processes measured
	leader, leader1                    string  // leader id before and after the run
	term0, term1                       uint64  // raft term before and after (a change = an election)
	indexEntries                       uint64  // leader's prefix index size after the run
	conns                              int     // client connections to the API port open after the run
}

func pct(s []time.Duration, p float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	i := int(float64(len(s)-1) * p)
	return s[i]
}

func summarize(name, target string, samples []sample, wall time.Duration, before, after cpuSnap, leaderIdx int, dps []*benchDP) result {
	r := result{name: name, target: target, sent: len(samples), wall: wall, errs: map[string]int{}, reasons: map[string]int{}, load: loadavg(), gomaxprocs: runtime.GOMAXPROCS(0)}
	var lat, sched []time.Duration
	var dec []int64
	for _, s := range samples {
		if s.err != "" {
			r.errs[s.err]++
			continue
		}
		r.ok++
		lat = append(lat, s.lat)
		if s.sched > 0 {
			sched = append(sched, s.sched)
		}
		dec = append(dec, s.decision)
		r.reasons[s.reason]++
	}
	slices.Sort(lat)
	slices.Sort(sched)
	slices.Sort(dec)
	r.p50, r.p90, r.p99 = pct(lat, .50), pct(lat, .90), pct(lat, .99)
	if len(lat) > 0 {
		r.pmax = lat[len(lat)-1]
	}
	r.schedP99 = pct(sched, .99)
	if len(dec) > 0 {
		r.decP50, r.decP99 = dec[(len(dec)-1)/2], dec[int(float64(len(dec)-1)*.99)]
	}
	r.rps = float64(r.ok) / wall.Seconds()
	if r.ok > 0 {
		per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(r.ok) }
		r.cpuClient = per(after.self - before.self)
		for i := range before.procs {
			d := after.procs[i] - before.procs[i]
			if i == leaderIdx {
				r.cpuLeader = per(d)
			} else {
				r.cpuFollowers += per(d)
			}
		}
	}
	if after.all > before.all {
		r.machineBusy = 100 * float64(after.busy-before.busy) / float64(after.all-before.all)
		ours := after.self - before.self
		for i := range before.procs {
			ours += after.procs[i] - before.procs[i]
		}
		r.others = max(0, r.machineBusy-100*ours.Seconds()/(wall.Seconds()*float64(runtime.NumCPU())))
	}
	for _, d := range dps {
		r.completeCalls += d.completeCalls.Swap(0)
		r.completeErrs += d.completeErrs.Swap(0)
		r.settled += d.settled.Swap(0)
	}
	return r
}

func (r result) leaderCol() string {
	if r.term0 == r.term1 && r.leader == r.leader1 {
		return fmt.Sprintf("%s (%d)", r.leader, r.term0)
	}
	return fmt.Sprintf("%s (%d) -> %s (%d) ELECTION", r.leader, r.term0, r.leader1, r.term1)
}

func (r result) errCount() int {
	n := 0
	for _, v := range r.errs {
		n += v
	}
	return n
}

func (r result) report(b *testing.B) {
	b.ReportMetric(r.rps, "routes/s")
	b.ReportMetric(float64(r.p50.Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(r.p90.Microseconds())/1000, "p90-ms")
	b.ReportMetric(float64(r.p99.Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(r.pmax.Microseconds())/1000, "max-ms")
	b.ReportMetric(float64(r.errCount()), "errors")
	if r.cpuLeader > 0 {
		b.ReportMetric(r.cpuLeader, "leader-cpu-µs/route")
	}
	b.ReportMetric(r.cpuClient, "bench-cpu-µs/route")
	b.ReportMetric(0, "ns/op") // the default per-op time is meaningless here
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d.Microseconds())/1000) }

func printTable(title string, rs []result) {
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(os.Stdout, "\n=== %s (%s, nproc %d)\n", title, time.Now().UTC().Format(time.RFC3339), runtime.NumCPU())
	fmt.Fprintln(tw, "run\ttarget\tsent\tok\terrors\troutes/s\tp50 ms\tp90 ms\tp99 ms\tmax ms\tsched p99 ms\tdecide p50/p99 µs\tcpu µs/route L/F/bench\tbusy % all/others\tloadavg\thit/miss/ovl\tcomplete calls/errs\tconns\tindex entries\tleader (term)\t")
	for _, r := range rs {
		sched := "-"
		if r.schedP99 > 0 {
			sched = ms(r.schedP99)
		}
		var errs []string
		for k, v := range r.errs {
			errs = append(errs, fmt.Sprintf("%s:%d", k, v))
		}
		sort.Strings(errs)
		e := strconv.Itoa(r.errCount())
		if len(errs) > 0 {
			e += " (" + strings.Join(errs, ",") + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%.0f/%.0f/%.0f\t%.0f/%.0f\t%s\t%d/%d/%d\t%d/%d\t%d\t%d\t%s\t\n",
			r.name, r.target, r.sent, r.ok, e, r.rps, ms(r.p50), ms(r.p90), ms(r.p99), ms(r.pmax), sched,
			r.decP50, r.decP99, r.cpuLeader, r.cpuFollowers, r.cpuClient, r.machineBusy, r.others, r.load,
			r.reasons["cache_hit"], r.reasons["cache_miss"], r.reasons["hit_overloaded"], r.completeCalls, r.completeErrs, r.conns, r.indexEntries, r.leaderCol())
	}
	_ = tw.Flush()
}

// ---- drivers ------------------------------------------------------------

func callRoute(api routerAPI, req *cartv1.RouteRequest, d *benchDP) (s sample) {
	ctx, cancel := context.WithTimeout(context.Background(), benchCallTimeout)
	defer cancel()
	t0 := time.Now()
	resp, err := api.Route(ctx, connect.NewRequest(req))
	s.lat = time.Since(t0)
	if err != nil {
		s.err = connect.CodeOf(err).String()
		return s
	}
	s.decision = resp.Msg.GetDecisionMicros()
	s.reason = resp.Msg.GetReason()
	d.done(resp.Msg.GetTicket(), resp.Msg.GetWorker())
	return s
}

// runOpen sends rate routes/s for dur, each on its own goroutine, so a
// slow answer never delays the next send (no coordinated omission).
func runOpen(wl *workload, dps []*benchDP, rate int, dur time.Duration) ([]sample, time.Duration) {
	n := int(float64(rate) * dur.Seconds())
	samples := make([]sample, n)
	stop := make(chan struct{})
	var cwg, wg sync.WaitGroup
	for _, d := range dps {
		cwg.Add(1)
		go d.completer(stop, &cwg)
	}
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	for i := range n {
		due := start.Add(time.Duration(i) * interval)
		if w := time.Until(due); w > 0 {
			time.Sleep(w)
		}
		d := dps[i%len(dps)]
		req := wl.next(d.id)
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := callRoute(d.api, req, d)
			s.sched = time.Since(due)
			samples[i] = s
		}()
	}
	wg.Wait() // bounded: every call has a benchCallTimeout deadline
	wall := time.Since(start)
	close(stop)
	cwg.Wait()
	return samples, wall
}

// runClosed runs conc clients back to back for dur.
func runClosed(wl *workload, dps []*benchDP, conc int, dur time.Duration) ([]sample, time.Duration) {
	stop := make(chan struct{})
	var cwg, wg sync.WaitGroup
	for _, d := range dps {
		cwg.Add(1)
		go d.completer(stop, &cwg)
	}
	per := make([][]sample, conc)
	start := time.Now()
	deadline := start.Add(dur)
	for g := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := dps[g%len(dps)]
			for time.Now().Before(deadline) {
				per[g] = append(per[g], callRoute(d.api, wl.next(d.id), d))
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	close(stop)
	cwg.Wait()
	var all []sample
	for _, s := range per {
		all = append(all, s...)
	}
	return all, wall
}

func concList() []int {
	var out []int
	for _, f := range strings.Split(*benchConc, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && n > 0 {
			out = append(out, n)
		}
	}
	return out
}

// benchSuite runs the standard set of runs against api, collecting results.
type benchSuite struct {
	title     string
	procs     []*bproc // nil: in-process node at statusURL
	statusURL string
	apiPort   int
	wl        *workload
	dps       []*benchDP
	pids      []int
	leaderIdx int
	results   []result
	runDPs    []*benchDP // set by a run that used its own data planes
}

func (s *benchSuite) run(b *testing.B, name, target string, f func() ([]sample, time.Duration)) {
	b.Run(name, func(b *testing.B) {
		// Let the previous run's placements and completions settle.
		time.Sleep(time.Second)
		leader, term0 := s.retarget()
		before := snapCPU(s.pids)
		samples, wall := f()
		after := snapCPU(s.pids)
		dps := s.dps
		if s.runDPs != nil {
			dps, s.runDPs = s.runDPs, nil
		}
		r := summarize(name, target, samples, wall, before, after, s.leaderIdx, dps)
		r.conns = estabConns(s.apiPort)
		r.leader, r.term0 = leader, term0
		if st, err := status(s.url()); err == nil {
			r.term1, r.leader1, r.indexEntries = st.GetTerm(), st.GetLeaderId(), st.GetIndexEntries()
		}
		r.report(b)
		s.results = append(s.results, r)
	})
}

func (s *benchSuite) url() string {
	if s.procs == nil {
		return s.statusURL
	}
	return s.procs[max(s.leaderIdx, 0)].url()
}

// retarget points the data planes at the current leader (an overloaded
// leader can lose its lease and a follower take over) and returns its id
// and term.
func (s *benchSuite) retarget() (string, uint64) {
	if s.procs != nil {
		l, err := benchWaitLeader(s.procs, 15*time.Second)
		if err != nil {
			return "none", 0
		}
		for i, p := range s.procs {
			if p == l && i != s.leaderIdx {
				fmt.Printf("%s: leader is now %s: retargeting the data planes\n", s.title, p.id)
				s.dps, s.leaderIdx, s.apiPort = dataPlanesFor(p.url()), i, portOf(p.api)
			}
		}
	}
	st, err := status(s.url())
	if err != nil {
		return "?", 0
	}
	return st.GetLeaderId(), st.GetTerm()
}

func (s *benchSuite) standard(b *testing.B) {
	// Warm-up: connections, the group prefixes in the index.
	runOpen(s.wl, s.dps, 500, time.Second)
	for _, d := range s.dps {
		d.completeCalls.Store(0)
		d.completeErrs.Store(0)
		d.settled.Store(0)
	}
	dur := *benchDur
	open := func(rate int) func() ([]sample, time.Duration) {
		return func() ([]sample, time.Duration) { return runOpen(s.wl, s.dps, rate, dur) }
	}
	closed := func(c int) func() ([]sample, time.Duration) {
		return func() ([]sample, time.Duration) { return runClosed(s.wl, s.dps, c, dur) }
	}
	gmp1 := func(f func() ([]sample, time.Duration)) func() ([]sample, time.Duration) {
		return func() ([]sample, time.Duration) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
			return f()
		}
	}
	s.run(b, "open-1k", "1000/s", open(1000))
	s.run(b, "open-2k", "2000/s", open(2000))
	for _, c := range concList() {
		s.run(b, fmt.Sprintf("closed-c%d", c), fmt.Sprintf("closed c=%d", c), closed(c))
	}
	// The same closed loop with the clients declining gzip: the difference
	// is what compressing every ~100-byte RouteResponse costs.
	s.run(b, "closed-c32", "closed c=32", closed(32))
	s.run(b, "closed-c32-nogzip", "closed c=32", func() ([]sample, time.Duration) {
		s.runDPs = dataPlanesGzip(s.url(), false)
		return runClosed(s.wl, s.runDPs, 32, dur)
	})
	// The load generator shares the cores with the servers: measure again
	// with the benchmark process held to one P.
	s.run(b, "closed-c32-bench-gmp1", "closed c=32", gmp1(closed(32)))
	// Overload last: a backlog of thousands of calls can cost the leader
	// its lease, and the runs after it would measure the recovery.
	s.run(b, "open-5k", "5000/s", open(5000))
	s.run(b, "open-5k-bench-gmp1", "5000/s", gmp1(open(5000)))
}

func procPIDs(procs []*bproc, leader *bproc) (pids []int, leaderIdx int) {
	for i, p := range procs {
		pids = append(pids, p.cmd.Process.Pid)
		if p == leader {
			leaderIdx = i
		}
	}
	return pids, leaderIdx
}

// probeIndex routes a fresh prompt (no shared prefix) and asks again with
// dry_run: a working index matches the whole prompt the second time. It
// tells whether the leader still records new prefixes after the run.
func probeIndex(api routerAPI) string {
	wl := newWorkload()
	req := wl.next("probe")
	for i := range req.BlockHashes {
		req.BlockHashes[i] = mix64(uint64(i) ^ wl.salt ^ 0xabcdef)
		if i > 0 {
			req.BlockHashes[i] ^= req.BlockHashes[i-1]
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), benchCallTimeout)
	defer cancel()
	first, err := api.Route(ctx, connect.NewRequest(req))
	if err != nil {
		return "probe route: " + err.Error()
	}
	time.Sleep(100 * time.Millisecond)
	dry := proto.Clone(req).(*cartv1.RouteRequest)
	dry.DryRun = true
	again, err := api.Route(ctx, connect.NewRequest(dry))
	if err != nil {
		return "probe dry-run: " + err.Error()
	}
	_, _ = api.Complete(ctx, connect.NewRequest(&cartv1.CompleteRequest{DataplaneId: "probe", Completions: []*cartv1.Completion{{Ticket: first.Msg.GetTicket(), Worker: first.Msg.GetWorker(), Delivered: true}}}))
	return fmt.Sprintf("fresh %d-char prompt routed to %s, then re-asked (dry run): %s, matched %d of %d chars",
		req.GetKeyLength(), first.Msg.GetWorker(), again.Msg.GetReason(), again.Msg.GetMatchedChars(), req.GetKeyLength())
}

func clusterLine(url string) string {
	st, err := status(url)
	if err != nil {
		return "status: " + err.Error()
	}
	return fmt.Sprintf("leader %s term %d last_log_index %d commit %d index_entries %d workers %d healthy %d dataplanes %d",
		st.GetLeaderId(), st.GetTerm(), st.GetLastLogIndex(), st.GetCommitIndex(), st.GetIndexEntries(), st.GetWorkers(), st.GetHealthyWorkers(), st.GetDataplanes())
}

// ---- benchmarks -----------------------------------------------------------

// BenchmarkRouteCluster3 drives the leader of a 3-process cluster.
func BenchmarkRouteCluster3(b *testing.B) {
	benchProcs(b, 3, "3-node cluster (processes), Route to the leader")
}

// BenchmarkRouteSingleNode drives a 1-process cluster (no replication
// round trips; still bolt fsync per batch).
func BenchmarkRouteSingleNode(b *testing.B) {
	benchProcs(b, 1, "1-node cluster (process)")
}

func benchProcs(b *testing.B, n int, title string) {
	workers := benchReplicas(b, benchWorkers)
	procs, leader := benchCluster(b, n, workers)
	pids, li := procPIDs(procs, leader)
	s := &benchSuite{title: title, procs: procs, wl: newWorkload(), dps: dataPlanesFor(leader.url()), pids: pids, leaderIdx: li, apiPort: portOf(leader.api)}
	fmt.Printf("\n%s: before: %s (loadavg %s)\n", title, clusterLine(leader.url()), loadavg())
	s.standard(b)
	s.retarget()
	fmt.Printf("%s: after: %s\n", title, clusterLine(s.url()))
	fmt.Printf("%s: index probe: %s\n", title, probeIndex(s.dps[0].api))
	printTable(title, s.results)
	for _, p := range procs {
		if lg := strings.TrimSpace(p.out.String()); lg != "" {
			fmt.Printf("--- %s log (last 2000 chars):\n%s\n", p.id, tail(lg, 2000))
		}
	}
}

func portOf(hostport string) int {
	_, p, _ := net.SplitHostPort(hostport)
	n, _ := strconv.Atoi(p)
	return n
}

// estabConns counts established TCP connections whose remote port is
// port, i.e. client connections to the API (the benchmark's, and the
// followers' forwarding connections if any).
func estabConns(port int) int {
	if port == 0 {
		return 0
	}
	n := 0
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) < 4 || fs[3] != "01" {
				continue
			}
			_, rp, ok := strings.Cut(fs[2], ":")
			if v, err := strconv.ParseUint(rp, 16, 32); ok && err == nil && int(v) == port {
				n++
			}
		}
	}
	return n
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// startInProcess runs node n1 inside the benchmark process (bootstrap,
// with the workers) and, if followers > 0, that many `cart controlplane`
// processes joining it; it waits until n1 leads with every worker healthy.
func startInProcess(b *testing.B, workers []string, followers int) (*daemon.Daemon, *cpProc, []*bproc) {
	dir := b.TempDir()
	p := &cpProc{id: "n1", api: benchFreePort(b), raft: benchFreePort(b), dir: filepath.Join(dir, "d1"), cfg: filepath.Join(dir, "n1.yaml")}
	benchConfig(b, p, true, "", workers)
	cfg, err := config.Load(p.cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := cfg.Validate(config.RoleControlPlane); err != nil {
		b.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithCancel(context.Background())
	d, err := daemon.Start(ctx, cfg, log)
	if err != nil {
		cancel()
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", p.api)
	if err != nil {
		cancel()
		b.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- d.Serve(ctx, ln) }()
	var fs []*bproc
	b.Cleanup(func() {
		for _, f := range fs {
			f.stop(syscall.SIGKILL)
		}
		cancel()
		select {
		case <-served:
		case <-time.After(10 * time.Second):
		}
	})
	if err := waitInProcess(p.url(), 1, 20*time.Second); err != nil {
		b.Fatal(err)
	}
	for i := 2; i <= followers+1; i++ {
		f := &bproc{cpProc: &cpProc{id: fmt.Sprintf("n%d", i), api: benchFreePort(b), raft: benchFreePort(b),
			dir: filepath.Join(dir, fmt.Sprintf("d%d", i)), cfg: filepath.Join(dir, fmt.Sprintf("n%d.yaml", i))}}
		benchConfig(b, f.cpProc, false, p.url(), workers)
		benchStartProc(b, f)
		fs = append(fs, f)
	}
	if err := waitInProcess(p.url(), followers+1, 30*time.Second); err != nil {
		for _, f := range fs {
			b.Logf("--- %s log:\n%s", f.id, f.out.String())
		}
		b.Fatal(err)
	}
	return d, p, fs
}

func waitInProcess(url string, members int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		st, err := status(url)
		if err == nil && st.GetState() == "leader" && len(st.GetMembers()) == members && st.GetHealthyWorkers() == benchWorkers {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("in-process node not ready: %v %v", st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// BenchmarkRouteInProcessLeader3 is the 3-node cluster with the leader
// inside the benchmark process (the followers are processes), so that
// -cpuprofile shows the leader's side of a replicated Route: there is no
// pprof endpoint on the daemon. Client and leader share the process; the
// "bench" CPU column is both.
func BenchmarkRouteInProcessLeader3(b *testing.B) {
	workers := benchReplicas(b, benchWorkers)
	_, p, fs := startInProcess(b, workers, 2)
	var pids []int
	for _, f := range fs {
		pids = append(pids, f.cmd.Process.Pid)
	}
	wl := newWorkload()
	dps := dataPlanesFor(p.url())
	s := &benchSuite{title: "3-node cluster, leader in the bench process", wl: wl, dps: dps, pids: pids, leaderIdx: -1, apiPort: portOf(p.api), statusURL: p.url()}
	runOpen(wl, dps, 500, time.Second)
	dur := *benchDur
	s.run(b, "open-1k", "1000/s", func() ([]sample, time.Duration) { return runOpen(wl, dps, 1000, dur) })
	s.run(b, "open-2k", "2000/s", func() ([]sample, time.Duration) { return runOpen(wl, dps, 2000, dur) })
	s.run(b, "closed-c32", "closed c=32", func() ([]sample, time.Duration) { return runClosed(wl, dps, 32, dur) })
	s.run(b, "closed-c32-nogzip", "closed c=32", func() ([]sample, time.Duration) {
		s.runDPs = dataPlanesGzip(p.url(), false)
		return runClosed(wl, s.runDPs, 32, dur)
	})
	fmt.Printf("in-process leader: after: %s\n", clusterLine(p.url()))
	printTable("3-node cluster, leader in the bench process (bench cpu = leader + clients; F = both followers)", s.results)
}

// BenchmarkRouteInProcess runs one node inside the benchmark process and
// drives it twice: calling the Connect handler directly (decision cost,
// lock contention with Raft applies, no serialisation or network) and
// through its API over loopback h2c (adds protobuf + HTTP/2 both ways).
// Profile it with -cpuprofile to see where the time goes.
func BenchmarkRouteInProcess(b *testing.B) {
	workers := benchReplicas(b, benchWorkers)
	d, p, _ := startInProcess(b, workers, 0)
	direct := d.Core.Router()
	var dps []*benchDP
	for i := range benchDataPlanes {
		dps = append(dps, &benchDP{id: fmt.Sprintf("bench-dp-%d", i), api: direct})
	}
	wl := newWorkload()
	s := &benchSuite{title: "in-process, handler called directly", wl: wl, dps: dps, statusURL: p.url()}
	runOpen(wl, dps, 500, time.Second)
	dur := *benchDur
	s.run(b, "direct-open-5k", "5000/s", func() ([]sample, time.Duration) { return runOpen(wl, dps, 5000, dur) })
	for _, c := range []int{1, 16} {
		s.run(b, fmt.Sprintf("direct-closed-c%d", c), fmt.Sprintf("closed c=%d", c), func() ([]sample, time.Duration) { return runClosed(wl, dps, c, dur) })
	}
	h2c := dataPlanesFor(p.url())
	s.dps, s.apiPort = h2c, portOf(p.api)
	s.run(b, "h2c-open-1k", "1000/s", func() ([]sample, time.Duration) { return runOpen(wl, h2c, 1000, dur) })
	s.run(b, "h2c-closed-c32", "closed c=32", func() ([]sample, time.Duration) { return runClosed(wl, h2c, 32, dur) })
	s.run(b, "h2c-closed-c32-nogzip", "closed c=32", func() ([]sample, time.Duration) {
		s.runDPs = dataPlanesGzip(p.url(), false)
		return runClosed(wl, s.runDPs, 32, dur)
	})
	s.run(b, "h2c-open-5k", "5000/s", func() ([]sample, time.Duration) { return runOpen(wl, h2c, 5000, dur) })
	fmt.Printf("in-process: after: %s\n", clusterLine(p.url()))
	fmt.Printf("in-process: index probe: %s\n", probeIndex(direct))
	// What a Raft snapshot of this state costs: Capture runs under the
	// engine lock (every Route waits), Write runs outside it.
	t0 := time.Now()
	snap := d.St.Capture()
	held := time.Since(t0)
	var cw countingWriter
	t1 := time.Now()
	err := snap.Write(&cw)
	fmt.Printf("in-process: snapshot: Capture held the engine lock %v (%s); Write encoded %s in %v (err %v)\n",
		held.Round(time.Microsecond), clusterLine(p.url()), mb(cw.n), time.Since(t1).Round(time.Millisecond), err)
	printTable("in-process node (handler direct / own API over h2c); cpu columns: all in the bench process", s.results)
}

// BenchmarkRaftLogGrowth measures what -cartbench.growth routes (default
// 100k) add to the Raft log and the data dirs of a 3-node cluster.
func BenchmarkRaftLogGrowth(b *testing.B) {
	workers := benchReplicas(b, benchWorkers)
	procs, leader := benchCluster(b, 3, workers)
	wl := newWorkload()
	dps := dataPlanesFor(leader.url())
	runOpen(wl, dps, 500, time.Second) // warm-up
	time.Sleep(500 * time.Millisecond)

	n, rate := *benchGrowth, *benchGrowthRate
	st0, err := status(leader.url())
	if err != nil {
		b.Fatal(err)
	}
	sizes0 := dirSizes(procs)
	start := time.Now()
	var samples []sample
	var wall time.Duration
	target := fmt.Sprintf("%d routes at %d/s", n, rate)
	if rate > 0 {
		samples, wall = runOpen(wl, dps, rate, time.Duration(float64(n)/float64(rate)*float64(time.Second)))
	} else {
		target = fmt.Sprintf("%d routes, closed loop c=32", n)
		// Closed loop for as long as n routes take (bounded at 10 minutes).
		stop := time.Now().Add(10 * time.Minute)
		cur := leader
		for ok := 0; ok < n && time.Now().Before(stop); {
			if l, err := benchWaitLeader(procs, 15*time.Second); err == nil && l != cur {
				fmt.Printf("growth: leader is now %s\n", l.id)
				cur, dps = l, dataPlanesFor(l.url())
			}
			s, w := runClosed(wl, dps, 32, time.Second)
			samples, wall = append(samples, s...), wall+w
			for _, x := range s {
				if x.err == "" {
					ok++
				}
			}
		}
	}
	time.Sleep(time.Second) // the last batches commit
	st1, err := status(leader.url())
	if err != nil {
		b.Fatal(err)
	}
	sizes1 := dirSizes(procs)
	ok := 0
	for _, s := range samples {
		if s.err == "" {
			ok++
		}
	}
	first, last := st0.GetLastLogIndex()+1, st1.GetLastLogIndex()
	entries := last - first + 1
	fmt.Printf("\nRaft log growth: %s, took %v (%.0f routes/s); ok %d of %d; loadavg %s\n", target, time.Since(start).Round(time.Millisecond), float64(ok)/wall.Seconds(), ok, len(samples), loadavg())
	fmt.Printf("leader %s (term %d -> %d, leader now %s): last_log_index %d -> %d (%d entries, %.0f per 100k routes), index_entries %d -> %d\n",
		leader.id, st0.GetTerm(), st1.GetTerm(), st1.GetLeaderId(), st0.GetLastLogIndex(), st1.GetLastLogIndex(), entries, float64(entries)*100000/float64(ok), st0.GetIndexEntries(), st1.GetIndexEntries())
	for i, p := range procs {
		fmt.Printf("  %s: raft.db %s -> %s (+%s), snapshots %s -> %s; %s\n", p.id,
			mb(sizes0[i].db), mb(sizes1[i].db), mb(sizes1[i].db-sizes0[i].db), mb(sizes0[i].snaps), mb(sizes1[i].snaps), snapNames(p.dir))
	}
	dbGrowth := sizes1[0].db - sizes0[0].db
	b.ReportMetric(float64(entries)*100000/float64(ok), "entries/100k-routes")
	b.ReportMetric(float64(dbGrowth)/float64(ok), "raftdb-file-bytes/route")

	// Read the entries back from the leader's log (stop every node first:
	// bolt holds an exclusive lock).
	for _, p := range procs {
		p.stop(syscall.SIGTERM)
	}
	ls, err := readLog(filepath.Join(leader.dir, "raft.db"), first, last)
	if err != nil {
		fmt.Printf("read leader log: %v\n", err)
		return
	}
	fmt.Printf("leader log entries %d..%d: %s\n", first, last, ls)
	b.ReportMetric(float64(ls.bytes)/float64(ok), "log-bytes/route")
	b.ReportMetric(0, "ns/op")
}

type dirSize struct{ db, snaps int64 }

func dirSizes(procs []*bproc) []dirSize {
	var out []dirSize
	for _, p := range procs {
		var d dirSize
		if fi, err := os.Stat(filepath.Join(p.dir, "raft.db")); err == nil {
			d.db = fi.Size()
		}
		_ = filepath.Walk(filepath.Join(p.dir, "snapshots"), func(_ string, fi os.FileInfo, err error) error {
			if err == nil && !fi.IsDir() {
				d.snaps += fi.Size()
			}
			return nil
		})
		out = append(out, d)
	}
	return out
}

func snapNames(dir string) string {
	es, _ := os.ReadDir(filepath.Join(dir, "snapshots"))
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return fmt.Sprintf("%d snapshots %v", len(names), names)
}

func mb(n int64) string { return fmt.Sprintf("%.2f MB", float64(n)/1e6) }

type logStats struct {
	present, missing   int
	bytes              int64
	byType             map[string]int
	placements, hashes int
	unplacements       int
	maxEntry           int
	firstIndex         uint64
}

func (l logStats) String() string {
	per := 0.0
	if n := l.byType["place_batch"]; n > 0 {
		per = float64(l.placements) / float64(n)
	}
	return fmt.Sprintf("%d present (%d truncated by snapshots; log now starts at %d), %s of entry data, max entry %d B, types %v, %d placements (%.1f per place_batch entry, %.1f hashes each), %d withdrawals",
		l.present, l.missing, l.firstIndex, mb(l.bytes), l.maxEntry, l.byType, l.placements, per, float64(l.hashes)/float64(max(l.placements, 1)), l.unplacements)
}

func readLog(path string, first, last uint64) (logStats, error) {
	st := logStats{byType: map[string]int{}}
	store, err := raftboltdb.New(raftboltdb.Options{Path: path, BoltOptions: &bbolt.Options{ReadOnly: true, Timeout: 5 * time.Second}})
	if err != nil {
		return st, err
	}
	defer store.Close()
	st.firstIndex, _ = store.FirstIndex()
	deadline := time.Now().Add(time.Minute)
	for i := first; i <= last && time.Now().Before(deadline); i++ {
		var l raft.Log
		if err := store.GetLog(i, &l); err != nil {
			if errors.Is(err, raft.ErrLogNotFound) {
				st.missing++
				continue
			}
			return st, err
		}
		st.present++
		st.bytes += int64(len(l.Data))
		st.maxEntry = max(st.maxEntry, len(l.Data))
		if l.Type != raft.LogCommand {
			st.byType[l.Type.String()]++
			continue
		}
		var cmd cartv1.RaftCommand
		if proto.Unmarshal(l.Data, &cmd) != nil {
			st.byType["undecodable"]++
			continue
		}
		switch b := cmd.GetBody().(type) {
		case *cartv1.RaftCommand_PlaceBatch:
			st.byType["place_batch"]++
			st.placements += len(b.PlaceBatch.GetPlacements())
			for _, p := range b.PlaceBatch.GetPlacements() {
				st.hashes += len(p.GetBlockHashes())
			}
		case *cartv1.RaftCommand_UnplaceBatch:
			st.byType["unplace_batch"]++
			st.unplacements += len(b.UnplaceBatch.GetPlacements())
		default:
			st.byType[fmt.Sprintf("%T", b)]++
		}
	}
	return st, nil
}

// BenchmarkPlaceBatchApply times State.Apply of one PlaceBatch log entry
// as the placement batcher produces it (k placements of the unique suffix
// of a workload prompt, ~66 hashes each). Apply holds the engine lock,
// shared with Route, for the whole entry, so ns/op is how long every Route
// on that node waits behind one batch. "leader" applies placements the
// engine already inserted at Route time (what the leader does with its own
// batches); "follower" inserts them fresh. "full" starts with the index at
// its ceiling (max_tree_size + 1/8 headroom, the control plane's state
// after a few minutes: nothing evicts it). Run with a fixed count, e.g.
// -benchtime 300x: every iteration builds its batch untimed.
func BenchmarkPlaceBatchApply(b *testing.B) {
	cfg := config.Default()
	for _, fill := range []string{"empty", "full"} {
		for _, role := range []string{"follower", "leader"} {
			for _, k := range []int{50, 512} {
				b.Run(fmt.Sprintf("%s/%s/k=%d", fill, role, k), func(b *testing.B) {
					dec := decider.New(decider.Options{Policy: decider.PolicyFrom(cfg), MaxEntries: cfg.Cache.MaxTreeSize,
						InlineEvict: cfg.Cache.EvictionIntervalSecs <= 0, Rand: rand.New(rand.NewPCG(1, 2))})
					st := state.New(dec)
					// The benchmark fills and pre-places untimed, inside the
					// decider's critical section like every index change.
					var idx *index.Index
					dec.Do(decider.OpRead, func(e *engine.Engine) { idx = e.Index() })
					locked := func(fn func()) { dec.Do(decider.OpRead, func(*engine.Engine) { fn() }) }
					set := &cartv1.SetWorkersCommand{}
					for w := range benchWorkers {
						set.Workers = append(set.Workers, &cartv1.WorkerSpec{Url: fmt.Sprintf("http://w%d", w)})
					}
					data, err := state.Encode(&cartv1.RaftCommand{Body: &cartv1.RaftCommand_SetWorkers{SetWorkers: set}})
					if err != nil {
						b.Fatal(err)
					}
					if _, err := st.Apply(1, data); err != nil {
						b.Fatal(err)
					}
					wl := newWorkload()
					now := time.Now().UnixNano()
					if fill == "full" {
						locked(func() {
							ceiling := cfg.Cache.MaxTreeSize + cfg.Cache.MaxTreeSize/8
							for i := 0; idx.Len() < ceiling && i < 10_000_000; i++ {
								idx.Insert(wl.next("fill").BlockHashes, index.WorkerID(i%benchWorkers), now)
							}
						})
					}
					hashes := 0
					b.ResetTimer()
					for i := range b.N {
						b.StopTimer()
						batch := &cartv1.PlaceBatchCommand{}
						for j := range k {
							h := wl.next("b").BlockHashes
							w := j % benchWorkers
							if role == "leader" {
								locked(func() { idx.Insert(h, index.WorkerID(w), now) })
							}
							batch.Placements = append(batch.Placements, &cartv1.Placement{Worker: fmt.Sprintf("http://w%d", w), BlockHashes: h[benchPrefixChars/benchBlockChars:], AtUnixNanos: now})
							hashes += len(h) - benchPrefixChars/benchBlockChars
						}
						data, err := state.Encode(&cartv1.RaftCommand{Ignorable: true, Body: &cartv1.RaftCommand_PlaceBatch{PlaceBatch: batch}})
						if err != nil {
							b.Fatal(err)
						}
						b.StartTimer()
						if _, err := st.Apply(uint64(i+2), data); err != nil {
							b.Fatal(err)
						}
					}
					b.StopTimer()
					b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(hashes), "ns/hash")
					b.ReportMetric(float64(dec.Stats().IndexEntries), "index-entries")
				})
			}
		}
	}
}

type countingWriter struct{ n int64 }

func (w *countingWriter) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }

// bytesBuffer is a goroutine-safe log sink for the child processes.
type bytesBuffer struct {
	mu sync.Mutex
	b  []byte
}

var _ io.Writer = (*bytesBuffer)(nil)

func (w *bytesBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, p...)
	return len(p), nil
}

func (w *bytesBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.b)
}
