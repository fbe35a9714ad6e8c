package remote

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
	"github.com/cartrouter/cart/dataplane/router"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/prefixload"
)

const shadowBlockChars = 16

var testShadow = ShadowOptions{Entries: 1 << 12, Threshold: 0.3, BalanceAbs: 4, BalanceRel: 1.5}

func keyHashes(s string) []uint64 { return index.Hash(nil, "m", []byte(s), shadowBlockChars) }

func TestShadowPick(t *testing.T) {
	prefix := "0123456789abcdef0123456789abcdef0123456789abcdef" // 3 blocks
	key := prefix + "-tail-of-request"
	hs := keyHashes(key)
	s := newShadow(testShadow)
	s.record(keyHashes(prefix), wA)
	s.record(keyHashes(prefix[:16]), wB)
	all := []usableWorker{{wA, 0}, {wB, 0}, {wC, 0}}
	tests := []struct {
		name   string
		usable []usableWorker
		least  string
		eff    int
		want   string
	}{
		{"longest match", all, wC, 0, wA},
		{"longest holder unusable: next", []usableWorker{{wB, 0}, {wC, 0}}, wC, 0, ""}, // wB: 16 of 64 chars < 0.3
		{"overloaded holder", []usableWorker{{wA, 10}, {wB, 0}, {wC, 0}}, wC, 0, ""},
		{"busier but within the rule", []usableWorker{{wA, 3}, {wC, 0}}, wC, 0, wA},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, _ := s.pick(hs, len(key), shadowBlockChars, tt.usable, tt.least, tt.eff); got != tt.want {
				t.Fatalf("pick = %q, want %q", got, tt.want)
			}
		})
	}
	// The latest placement of a prefix wins over an earlier, less loaded
	// holder: it is where the prefix is most likely still cached.
	s.record(keyHashes(prefix), wC)
	if got, _ := s.pick(hs, len(key), shadowBlockChars, []usableWorker{{wA, 0}, {wB, 0}, {wC, 2}}, wA, 0); got != wC {
		t.Fatalf("after a later placement on %s: pick = %q", wC, got)
	}
	if got, _ := (*shadow)(nil).pick(hs, len(key), shadowBlockChars, all, wC, 0); got != "" {
		t.Fatalf("disabled shadow picked %q", got)
	}
}

// A hot prefix the control plane moved around the pool is not held by
// every worker it ever went to: fallback follows its latest placement,
// and a deeper, conversation-specific block still beats the shared
// prefix's latest holder.
func TestShadowFollowsLatestPlacement(t *testing.T) {
	system := "0123456789abcdef0123456789abcdef"       // 2 blocks shared by all
	conv := system + "conversation one, turn one!!!!!" // +2 blocks
	s := newShadow(testShadow)
	for _, w := range []string{wA, wB, wC, wD, wB} {
		s.record(keyHashes(system+"|q"), w)
	}
	usable := []usableWorker{{wA, 0}, {wB, 3}, {wC, 0}, {wD, 0}}
	if got, _ := s.pick(keyHashes(system+"|r"), len(system)+2, shadowBlockChars, usable, wA, 0); got != wB {
		t.Fatalf("shared prefix: pick = %q, want its latest holder %s", got, wB)
	}
	s.record(keyHashes(conv), wD)
	s.record(keyHashes(system+"|s"), wA)
	if got, _ := s.pick(keyHashes(conv+"turn two"), len(conv)+8, shadowBlockChars, usable, wA, 0); got != wD {
		t.Fatalf("conversation: pick = %q, want %s, which holds its deeper blocks", got, wD)
	}
}

// The shadow is bounded: old prefixes are forgotten, recent ones kept.
func TestShadowIsBounded(t *testing.T) {
	s := newShadow(ShadowOptions{Entries: 64, Threshold: 0.3, BalanceAbs: 4, BalanceRel: 1.5})
	for i := range 200 {
		s.record(keyHashes(fmt.Sprintf("prompt-%06d-%s", i, "0123456789abcdef0123456789abcdef")), wA)
	}
	if n := s.idx.Len(); n > 64 {
		t.Fatalf("shadow holds %d entries, bound 64", n)
	}
	recent := fmt.Sprintf("prompt-%06d-%s", 199, "0123456789abcdef0123456789abcdef")
	if got, _ := s.pick(keyHashes(recent), len(recent), shadowBlockChars, []usableWorker{{wA, 0}, {wB, 0}}, wB, 0); got != wA {
		t.Fatalf("recent prefix forgotten: %q", got)
	}
}

type faultResult struct {
	requests, fallbacks, repeats, hits int
	latencies                          []time.Duration // of each fault-phase Route call
}

// add counts one decision.
func (r *faultResult) add(d router.Decision, repeat, hit bool) {
	r.requests++
	if d.Reason == ReasonFallbackLocal {
		r.fallbacks++
	}
	if repeat {
		r.repeats++
		if hit {
			r.hits++
		}
	}
}

// drive sends the workload through the data planes (request i through
// dps[i%len(dps)]) from clients concurrent clients until stop(i), each
// client keeping two requests open (a request completes two decisions
// later) and pausing pace between requests; record sees every decision.
func drive(t *testing.T, dps []*Router, wl *prefixload.Workload, clients int, pace time.Duration, stop func(i int) bool,
	record func(dp *Router, d router.Decision, took time.Duration, repeat, hit bool)) {
	t.Helper()
	const inFlight = 2
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var open []router.Decision
			var openDP []*Router
			for i := c; !stop(i); i += clients {
				dp := dps[i%len(dps)]
				g, key := wl.Next()
				start := time.Now()
				d, err := dp.Decide(context.Background(), &router.Request{Model: "m", Hashes: keyHashes(key), KeyLen: len(key)})
				took := time.Since(start)
				if err != nil {
					t.Error(err)
					return
				}
				repeat, hit := wl.Landed(g, d.Worker)
				record(dp, d, took, repeat, hit)
				open, openDP = append(open, d), append(openDP, dp)
				if len(open) > inFlight {
					openDP[0].Done(open[0], router.Outcome{Delivered: true})
					open, openDP = open[1:], openDP[1:]
				}
				if pace > 0 {
					time.Sleep(pace)
				}
			}
			for i := range open {
				openDP[i].Done(open[i], router.Outcome{Delivered: true})
			}
		}()
	}
	wg.Wait()
}

// latency returns the mean and 99th percentile of the Route calls.
func (r faultResult) latency() (mean, p99 time.Duration) {
	if len(r.latencies) == 0 {
		return 0, 0
	}
	l := slices.Clone(r.latencies)
	slices.Sort(l)
	var sum time.Duration
	for _, d := range l {
		sum += d
	}
	return sum / time.Duration(len(l)), l[(len(l)*99)/100]
}

func (r faultResult) String() string {
	return fmt.Sprintf("fallback %.0f%%, hit ratio %.0f%% (%d requests, %d repeats)",
		100*float64(r.fallbacks)/float64(max(1, r.requests)), 100*float64(r.hits)/float64(max(1, r.repeats)), r.requests, r.repeats)
}

// runFault warms two data planes through a cache-aware control plane, then
// breaks it (slow: every Route takes 200 ms against a 20 ms route timeout;
// cut: unreachable) and measures the fault phase: the share of decisions
// that fell back, and the share of repeated-prefix requests landing on a
// worker that had the prefix.
func runFault(t *testing.T, mode string, shadowOn bool) faultResult {
	return runFaultWith(t, mode, shadowOn, 0, 400)
}

// runFaultWith is runFault with the control-plane breaker opening after
// breakerFailures consecutive failures (0: no breaker), and requests
// decisions in the fault phase.
func runFaultWith(t *testing.T, mode string, shadowOn bool, breakerFailures, requests int) faultResult {
	t.Helper()
	workers := []string{wA, wB, wC, wD}
	var syncWorkers []*cartv1.Worker
	for _, w := range workers {
		syncWorkers = append(syncWorkers, &cartv1.Worker{Url: w, Healthy: true})
	}
	var engMu sync.Mutex
	eng := engine.New(engine.Policy{Threshold: 0.3, BalanceAbsThreshold: 4, BalanceRelThreshold: 1.5, BlockChars: shadowBlockChars},
		index.New(index.Options{MaxEntries: 1 << 16}), rand.New(rand.NewPCG(1, 2)))
	specs := make([]engine.WorkerSpec, len(workers))
	for i, w := range workers {
		specs[i] = engine.WorkerSpec{URL: w}
	}
	eng.SetWorkers(specs)
	cp := newFakeCP(t)
	cp.set(func(f *fakeCP) {
		f.syncResp = &cartv1.SyncResponse{Workers: syncWorkers, WorkersVersion: 1}
		f.routeFn = func(req *cartv1.RouteRequest) *cartv1.RouteResponse {
			engMu.Lock()
			defer engMu.Unlock()
			d, err := eng.Choose(engine.Request{Hashes: req.GetBlockHashes(), KeyLen: int(req.GetKeyLength())}, time.Now().UnixNano())
			if err != nil {
				t.Error(err)
				return &cartv1.RouteResponse{Worker: wA}
			}
			eng.Release(d.Worker) // load is not what this harness measures
			return &cartv1.RouteResponse{Worker: d.Worker, Reason: string(d.Reason), FromLeader: true}
		}
	})
	// A generous timeout while warming up, so that a loaded machine does
	// not turn warm-up decisions into fallbacks; the fault phase uses the
	// production default of 20 ms.
	opts := Options{ControlPlanes: []string{cp.url}, RouteTimeout: 5 * time.Second, BlockChars: shadowBlockChars,
		RouteBreakerFailures: breakerFailures, RouteBreakerCooloff: time.Second}
	if shadowOn {
		opts.Shadow = testShadow
	}
	var dps []*Router
	for i := range 2 {
		o := opts
		o.ID, o.Seed = fmt.Sprintf("dp%d", i), uint64(i)
		dp := newTestRouter(t, o)
		if err := dp.SyncOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		dps = append(dps, dp)
	}
	wl := prefixload.New(40, 12, 7)
	phase := func(n, clients int) faultResult {
		var mu sync.Mutex
		var res faultResult
		drive(t, dps, wl, clients, 0, func(i int) bool { return i >= n }, func(_ *Router, d router.Decision, took time.Duration, repeat, hit bool) {
			mu.Lock()
			defer mu.Unlock()
			res.latencies = append(res.latencies, took)
			res.add(d, repeat, hit)
		})
		return res
	}
	warm := phase(200, 1)
	if warm.fallbacks != 0 {
		t.Fatalf("warm-up fell back: %v", warm)
	}
	for _, dp := range dps {
		dp.o.RouteTimeout = 20 * time.Millisecond
	}
	switch mode {
	case "slow":
		cp.set(func(f *fakeCP) { f.routeDelay = 200 * time.Millisecond })
	case "cut":
		cp.srv.CloseClientConnections()
		cp.srv.Close()
	}
	clients := 1
	if mode == "slow" {
		clients = 16 // every decision waits out the 20 ms route timeout
	}
	return phase(requests, clients)
}

// With the control plane slow or cut off, fallback keeps routing repeated
// prefixes to the worker that has them, instead of least-loaded blind.
func TestFallbackKeepsCacheAwareness(t *testing.T) {
	for _, mode := range []string{"cut", "slow"} {
		t.Run(mode, func(t *testing.T) {
			before := runFault(t, mode, false)
			after := runFault(t, mode, true)
			t.Logf("%s control plane: without shadow: %v; with shadow: %v", mode, before, after)
			for _, r := range []faultResult{before, after} {
				if r.fallbacks*10 < r.requests*9 {
					t.Fatalf("the fault did not make decisions fall back: %v", r)
				}
			}
			if after.hits*100 < after.repeats*65 || (after.hits-before.hits)*100 < after.repeats*25 {
				t.Fatalf("shadow fallback hit ratio not clearly better: before %v, after %v", before, after)
			}
		})
	}
}

// During a long outage most prefixes are new: the shadow learns from the
// fallback's own decisions, so a prefix's next request follows its first.
func TestFallbackLearnsFromItsOwnDecisions(t *testing.T) {
	r := newTestRouter(t, Options{ControlPlanes: []string{downURL(t)}, BlockChars: shadowBlockChars, Shadow: testShadow,
		BootWorkers: []router.WorkerStatus{{URL: wA, Healthy: true}, {URL: wB, Healthy: true}, {URL: wC, Healthy: true}, {URL: wD, Healthy: true}}})
	for i := range 20 {
		prefix := fmt.Sprintf("conversation %04d: the first message of this conversation, several blocks", i)
		first, err := r.Decide(context.Background(), &router.Request{Model: "m", Hashes: keyHashes(prefix + " turn 1"), KeyLen: len(prefix) + 7})
		if err != nil {
			t.Fatal(err)
		}
		r.Done(first, router.Outcome{Delivered: true})
		next, err := r.Decide(context.Background(), &router.Request{Model: "m", Hashes: keyHashes(prefix + " turn 2"), KeyLen: len(prefix) + 7})
		if err != nil {
			t.Fatal(err)
		}
		r.Done(next, router.Outcome{Delivered: true})
		if next.Reason != ReasonFallbackLocal || next.Worker != first.Worker || next.Candidate != first.Worker || next.MatchedChars == 0 {
			t.Fatalf("prefix %d: first went to %s, next %+v", i, first.Worker, next)
		}
	}
}

// A shadow that has seen maxShadowWorkers distinct workers starts over:
// what it held is gone, the placement that overflowed it is held, and it
// keeps its index's table (emptied in place under the lock, not a new
// allocation).
func TestShadowStartsOverWhenOutOfWorkerIDs(t *testing.T) {
	s := newShadow(testShadow)
	prefix := "0123456789abcdef0123456789abcdef0123456789abcdef"
	s.record(keyHashes(prefix), wA)
	idx := s.idx
	for i := range maxShadowWorkers - 1 {
		s.record(keyHashes(fmt.Sprintf("worker %d's own prompt........", i)), fmt.Sprintf("http://w%d.test", i))
	}
	if len(s.urls) != maxShadowWorkers {
		t.Fatalf("%d worker ids before the overflow, want %d", len(s.urls), maxShadowWorkers)
	}
	other := "fedcba9876543210fedcba9876543210fedcba9876543210"
	s.record(keyHashes(other), wB)
	if s.idx != idx || len(s.urls) != 1 {
		t.Fatalf("after the overflow: same index %v, %d worker ids; want the same index and 1", s.idx == idx, len(s.urls))
	}
	all := []usableWorker{{wA, 0}, {wB, 0}}
	if got, _ := s.pick(keyHashes(prefix), len(prefix), shadowBlockChars, all, wB, 0); got != "" {
		t.Fatalf("a placement from before the overflow still picked %q", got)
	}
	if got, _ := s.pick(keyHashes(other), len(other), shadowBlockChars, all, wA, 0); got != wB {
		t.Fatalf("the overflowing placement: pick = %q, want %s", got, wB)
	}
}
