package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
)

// TestCluster brings up the distributed deployment with real processes —
// three `cart controlplane` nodes (Raft on disk), four `cart dataplane`s,
// four all-in-one `cart` routers for the split baseline, HAProxy in TCP
// mode in front of them, in-process cart-sim replicas — and checks the
// cross-role behaviour one step at a time. The subtests share the
// deployment and run in order; each sets the worker set it needs first.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a dozen processes; skipped with -short")
	}
	e := newEnv(t)
	steps := []struct {
		name string
		fn   func(*testing.T, *env)
	}{
		{"AddWorker", testAddWorker},
		{"HitRatio", testHitRatio},
		{"LeaderKill", testLeaderKill},
		{"EPPHitRatio", testEPPHitRatio},
		{"EPPLeaderKill", testEPPLeaderKill},
		{"DataPlaneKill", testDataPlaneKill},
		{"RemoveWorker", testRemoveWorker},
		{"RouteLatency", testRouteLatency},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			before := e.term(t)
			s.fn(t, e)
			// Only LeaderKill may change the leader. An election elsewhere
			// (a CPU-starved leader stepping down) resets the leader's soft
			// state and explains odd failures; say so.
			if after := e.term(t); s.name != "LeaderKill" && s.name != "EPPLeaderKill" && after != before {
				t.Logf("WARNING: the Raft leader changed during this step (%s -> %s)", before, after)
			}
		})
	}
}

// waitStableLeader waits until every live node agrees on the same leader
// and term for hold (three election timeouts is plenty).
func (e *env) waitStableLeader(t *testing.T, within, hold time.Duration) {
	t.Helper()
	var last string
	var since time.Time
	testkit.WaitForMsg(t, within, "a stable leader", func() (bool, string) {
		cur := ""
		for _, c := range e.cps {
			if !c.Running() {
				continue
			}
			st, err := e.status(c)
			if err != nil || st.GetLeaderId() == "" {
				last = ""
				return false, c.id + " has no leader"
			}
			v := fmt.Sprintf("%s@%d", st.GetLeaderId(), st.GetTerm())
			if cur != "" && v != cur {
				last = ""
				return false, "nodes disagree: " + cur + " vs " + v
			}
			cur = v
		}
		if cur != last {
			last, since = cur, time.Now()
		}
		return time.Since(since) >= hold, cur
	})
}

// term names the current leader and Raft term, e.g. "n2@3".
func (e *env) term(t *testing.T) string {
	t.Helper()
	l := e.waitLeader(t, 10*time.Second)
	st, err := e.status(l)
	if err != nil {
		return l.id + "@?"
	}
	return fmt.Sprintf("%s@%d", l.id, st.GetTerm())
}

// liveDPs returns the data planes currently running.
func (e *env) liveDPs() []*httpNode {
	var out []*httpNode
	for _, d := range e.dps {
		if d.Running() {
			out = append(out, d)
		}
	}
	return out
}

// 1. `cartctl workers add`: within a second every data plane knows the
// new replica, and every data plane routes requests to it.
func testAddWorker(t *testing.T, e *env) {
	e.setWorkers(t, urlsOf(e.fast))
	e.extra.s.Reset()
	dps := e.liveDPs()

	e.cartctl(t, "workers", "add", e.extra.url)
	added := time.Now()
	seen := map[string]time.Duration{}
	for deadline := added.Add(5 * time.Second); len(seen) < len(dps) && time.Now().Before(deadline); {
		for _, d := range dps {
			if _, ok := seen[d.id]; ok {
				continue
			}
			if ws, err := routerWorkers(d.url()); err == nil && slices.Contains(ws, e.extra.url) {
				seen[d.id] = time.Since(added)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	var slowest time.Duration
	for _, d := range dps {
		lag, ok := seen[d.id]
		if !ok {
			t.Fatalf("%s never listed the added worker in /workers within 5 s", d.id)
		}
		slowest = max(slowest, lag)
	}
	t.Logf("added worker visible on all %d data planes after %v (per data plane: %v)", len(dps), slowest.Round(time.Millisecond), seen)
	if slowest > time.Second {
		t.Errorf("a data plane learned the added worker only after %v, want within 1 s", slowest)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Each data plane, asked directly, routes some distinct prompts to it
	// (least-loaded with random ties over five idle replicas: each request
	// has a 1/5 chance, so 60 tries miss with probability 1.5e-6).
	for _, d := range dps {
		c := newClient(d.url(), keepAliveHTTP())
		got := false
		for i := 0; i < 60 && !got; i++ {
			r := chat(ctx, c, fmt.Sprintf("add check via %s, distinct prompt %d: %s", d.id, i, text(seedOf(d.id, itoa(i)), 80)), 2)
			if r.err != nil {
				t.Fatalf("request via %s: %v", d.id, r.err)
			}
			got = r.replica == e.extra.name
		}
		if !got {
			t.Errorf("%s never routed to the added worker in 60 distinct requests", d.id)
		}
	}
	// And through HAProxy, the new replica receives its share.
	before := e.extra.s.Stats().Requests
	c := newClient(e.fe["dp4"], oneShotHTTP())
	var errs atomic.Int64
	runBounded(40, 4, func(i int) {
		if r := chat(ctx, c, fmt.Sprintf("add check via haproxy %d: %s", i, text(seedOf("hap", itoa(i)), 80)), 2); r.err != nil {
			errs.Add(1)
			t.Errorf("request via HAProxy: %v", r.err)
		}
	})
	got := e.extra.s.Stats().Requests - before
	t.Logf("through HAProxy (4 data planes) the added replica received %d of 40 distinct requests", got)
	if got == 0 {
		t.Errorf("the added replica received none of 40 distinct requests through HAProxy")
	}
}

// Workload of the hit-ratio comparison.
const (
	hrGroups      = 48
	hrPerGroup    = 8
	hrPrefixChars = 2000
	hrConc        = 8
)

// prefixWorkload sends hrGroups × hrPerGroup prompts sharing a group
// prefix through base and returns Σ cached / Σ prompt tokens. The first
// prompt of every group goes out first and completes (a barrier), then the
// rest in a seeded random order with bounded concurrency. The barrier
// makes the ideal outcome exact — every later prompt can find its group's
// prefix cached on the replica that served the first — so the comparison
// measures routing, not the race between a group's first two requests.
func prefixWorkload(t *testing.T, base, label string) (float64, []result) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := newClient(base, oneShotHTTP())
	prefixes := make([]string, hrGroups)
	for g := range prefixes {
		prefixes[g] = groupPrefix(label, g, hrPrefixChars)
	}
	var mu sync.Mutex
	var all []result
	send := func(g, i int) {
		r := chat(ctx, c, prefixes[g]+suffix(label, g, i), 4)
		mu.Lock()
		all = append(all, r)
		mu.Unlock()
		if r.err != nil {
			t.Errorf("%s: group %d prompt %d: %v", label, g, i, r.err)
		}
	}
	runBounded(hrGroups, hrConc, func(g int) { send(g, 0) })
	type job struct{ g, i int }
	var jobs []job
	for g := 0; g < hrGroups; g++ {
		for i := 1; i < hrPerGroup; i++ {
			jobs = append(jobs, job{g, i})
		}
	}
	rand.New(rand.NewPCG(seedOf(label), 1)).Shuffle(len(jobs), func(a, b int) { jobs[a], jobs[b] = jobs[b], jobs[a] })
	runBounded(len(jobs), hrConc, func(k int) { send(jobs[k].g, jobs[k].i) })
	return hitRatio(all), all
}

// 2. Prefix-heavy workload through HAProxy: adding data planes does not
// split the cache (1, 2 and 4 data planes within 2 points), while the
// same number of independent all-in-one routers does.
//
// Why the split margins are robust: with the barrier, a shared control
// plane sends all 7 later prompts of a group to the replica that cached
// its prefix, so h = 7/8 × (cached prefix / prompt) ≈ 0.83, the same for
// any number of data planes. An independent router that sees a group for
// the first time routes by load (among 4 idle replicas: 1 in 4 happens to
// be the right one) and misses with probability 3/4. With per-request
// round robin over N routers and a shuffled order, group g's 7 later
// prompts reach each other router with probability 1 − (1 − 1/N)^7, so
// h_split ≈ h − (N−1) × (1 − (1−1/N)^7) × 3/4 × 1/8 × 0.95: about 9
// points lower for N=2 and about 23 for N=4 (measured: 7-10 and 17-21
// with 24 groups). Each miss moves the ratio by 0.95/384 with 48 groups,
// so the standard deviation is about 0.75 points (N=2) and 1.4 points
// (N=4); asserting 5 and 10 points leaves at least 4σ.
func testHitRatio(t *testing.T, e *env) {
	e.setWorkers(t, urlsOf(e.fast))
	runs := []struct {
		name, fe string
		nodes    []*httpNode
	}{
		{"1 data plane", "dp1", e.dps[:1]},
		{"2 data planes", "dp2", e.dps[:2]},
		{"4 data planes", "dp4", e.dps[:4]},
		{"split: 2 all-in-one", "split2", e.aios[:2]},
		{"split: 4 all-in-one", "split4", e.aios[:4]},
	}
	h := map[string]float64{}
	for _, run := range runs {
		for _, r := range e.fast {
			r.s.Reset()
		}
		fb0 := e.fallbackSum(t, run.nodes)
		start := time.Now()
		ratio, rs := prefixWorkload(t, e.fe[run.fe], "hr-"+run.fe)
		fb := e.fallbackSum(t, run.nodes) - fb0
		// Cross-check the client's figure with the replicas' own counters.
		var p, c int64
		for _, r := range e.fast {
			st := r.s.Stats()
			p += st.PromptTokens
			c += st.CachedTokens
		}
		h[run.fe] = ratio
		t.Logf("%-20s hit ratio %.4f (%d requests, %v; replicas say %.4f; fallbacks %v)",
			run.name, ratio, len(rs), time.Since(start).Round(time.Millisecond), float64(c)/float64(max(p, 1)), fb)
	}
	h1, h2, h4, s2, s4 := h["dp1"], h["dp2"], h["dp4"], h["split2"], h["split4"]
	if math.Abs(h2-h1) > 0.02 {
		t.Errorf("2 data planes: hit ratio %.4f vs %.4f with one, want within 0.02", h2, h1)
	}
	if math.Abs(h4-h1) > 0.02 {
		t.Errorf("4 data planes: hit ratio %.4f vs %.4f with one, want within 0.02", h4, h1)
	}
	if h2 < s2+0.05 {
		t.Errorf("2 data planes (%.4f) not clearly above 2 independent routers (%.4f): want ≥ 0.05 more", h2, s2)
	}
	if h4 < s4+0.10 {
		t.Errorf("4 data planes (%.4f) not clearly above 4 independent routers (%.4f): want ≥ 0.10 more", h4, s4)
	}
}

// 3. SIGKILL the Raft leader under load through HAProxy (2 data planes):
// every request is answered 200, a new leader within 3 s, and once the
// data planes route through the new leader the hit ratio is within 5
// points of before (the replicated index survived; all requests reuse
// prefixes established before the kill).
func testLeaderKill(t *testing.T, e *env) {
	e.setWorkers(t, urlsOf(e.fast))
	leaderKill(t, e, "failover", e.fe["dp2"], e.liveDPs(), len(e.liveDPs())+len(e.epps))
}

// leaderKill runs the leader kill through base, whose routers are nodes
// (their cart_fallback_total is summed); failover is complete once the
// new leader hears from reporters data planes (endpoint pickers count).
func leaderKill(t *testing.T, e *env, label, base string, dps []*httpNode, reporters int) {
	for _, r := range e.fast {
		r.s.Reset()
	}
	const (
		groups      = 12
		workers     = 4
		maxRequests = 6000 // hard bound; the phases below end it much sooner
		beforeN     = 100  // requests completed before the kill
		afterN      = 150  // requests started after failover completed
	)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := newClient(base, oneShotHTTP())
	prefixes := make([]string, groups)
	for g := range prefixes {
		prefixes[g] = groupPrefix(label, g, hrPrefixChars)
	}
	// Establish every group's prefix (placement committed through Raft).
	runBounded(groups, workers, func(g int) {
		if r := chat(ctx, c, prefixes[g]+suffix(label, g, -1), 4); r.err != nil {
			t.Errorf("establishing group %d: %v", g, r.err)
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	var (
		mu      sync.Mutex
		results []result
		next    atomic.Int64
	)
	stop := make(chan struct{})
	var stopOnce sync.Once
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		var wg sync.WaitGroup
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					select {
					case <-stop:
						return
					default:
					}
					i := int(next.Add(1))
					if i > maxRequests {
						return
					}
					g := i % groups
					r := chat(ctx, c, prefixes[g]+suffix(label, g, i), 4)
					mu.Lock()
					results = append(results, r)
					mu.Unlock()
					// Pacing: leave CPU to the Raft election on a 2-core box.
					time.Sleep(5 * time.Millisecond)
				}
			}()
		}
		wg.Wait()
	}()
	halt := func() { stopOnce.Do(func() { close(stop) }); <-loadDone }
	defer halt()
	count := func(pred func(result) bool) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, r := range results {
			if pred(r) {
				n++
			}
		}
		return n
	}
	testkit.WaitForMsg(t, 30*time.Second, "load before the kill", func() (bool, string) {
		n := count(func(result) bool { return true })
		return n >= beforeN, fmt.Sprint(n, " requests")
	})

	fb0 := e.fallbackSum(t, dps)
	old := e.waitLeader(t, 5*time.Second)
	killAt := time.Now()
	old.Kill()
	defer func() {
		// Bring the node back for the following subtests, and let any
		// election its return provokes happen here, not in the next step.
		old.Start(t)
		testkit.WaitForMsg(t, 20*time.Second, old.id+" rejoined", func() (bool, string) {
			st, err := e.status(old)
			if err != nil {
				return false, err.Error()
			}
			return st.GetLeaderId() != "" && len(st.GetMembers()) == 3, st.GetState()
		})
		e.waitStableLeader(t, 20*time.Second, 1500*time.Millisecond)
		t.Logf("%s restarted and rejoined; leader now %s", old.id, e.term(t))
	}()

	var leader *cpNode
	for time.Since(killAt) < 15*time.Second && leader == nil {
		leader = e.leaderNow()
		if leader == nil {
			time.Sleep(10 * time.Millisecond)
		}
	}
	electedAt := time.Now()
	if leader == nil {
		t.Fatalf("no new leader 15 s after SIGKILL of %s", old.id)
	}
	election := electedAt.Sub(killAt)
	if st, err := e.status(leader); err == nil {
		t.Logf("new leader %s at term %d", leader.id, st.GetTerm())
	}
	// Failover is complete when the new leader hears from every data
	// plane: from then on they route through it, not locally.
	testkit.WaitForMsg(t, 15*time.Second, "data planes reporting to the new leader", func() (bool, string) {
		st, err := e.status(leader)
		if err != nil {
			return false, err.Error()
		}
		return int(st.GetDataplanes()) >= reporters, fmt.Sprint(st.GetDataplanes(), " data planes")
	})
	settledAt := time.Now()
	fbSettled := e.fallbackSum(t, dps)
	testkit.WaitForMsg(t, 30*time.Second, "load after failover", func() (bool, string) {
		n := count(func(r result) bool { return r.start.After(settledAt) })
		return n >= afterN, fmt.Sprint(n, " requests")
	})
	halt()
	fb := e.fallbackSum(t, dps) - fb0

	var before, window, after []result
	var failed []result
	for _, r := range results {
		switch {
		case r.err != nil:
			failed = append(failed, r)
		case r.end.Before(killAt):
			before = append(before, r)
		case r.start.After(settledAt):
			after = append(after, r)
		default:
			window = append(window, r)
		}
	}
	hb, hw, ha := hitRatio(before), hitRatio(window), hitRatio(after)
	t.Logf("leader %s killed; %s elected after %v; data planes all on the new leader after %v",
		old.id, leader.id, election.Round(time.Millisecond), settledAt.Sub(killAt).Round(time.Millisecond))
	t.Logf("requests: %d total, %d failed; hit ratio before %.4f (%d), failover window %.4f (%d), after %.4f (%d)",
		len(results), len(failed), hb, len(before), hw, len(window), ha, len(after))
	t.Logf("fallbacks (sum of cart_fallback_total over %d data planes) during the leader kill: %v (%v of them after failover completed)",
		len(dps), fb, fb-(fbSettled-fb0))
	for i, r := range failed {
		if i < 5 {
			t.Errorf("client-visible error %.3fs after the kill: %v", r.start.Sub(killAt).Seconds(), r.err)
		}
	}
	if len(failed) > 0 {
		t.Errorf("%d of %d requests failed during the leader kill, want 0", len(failed), len(results))
	}
	if election > 3*time.Second {
		t.Errorf("new leader after %v, want within 3 s", election)
	}
	if len(before) == 0 || len(after) == 0 {
		t.Fatalf("no requests to compare (before %d, after %d)", len(before), len(after))
	}
	if math.Abs(ha-hb) > 0.05 {
		t.Errorf("hit ratio after failover %.4f vs %.4f before, want within 0.05", ha, hb)
	}
}

func sumLoad(ws []*cartv1.Worker) int {
	n := 0
	for _, w := range ws {
		n += int(w.GetLoad())
	}
	return n
}

// 4. SIGKILL a data plane with streams open through it and through
// another: only its own streams fail, and the leader's load view loses its
// share within the lease.
func testDataPlaneKill(t *testing.T, e *env) {
	e.setWorkers(t, urlsOf(e.slow))
	victim, other := e.dps[0], e.dps[1]
	const perDP, tokens = 3, 150 // 150 × 10 ms ≈ 1.5 s per stream
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var mine, theirs []*stream
	for i := 0; i < perDP; i++ {
		mine = append(mine, startStream(ctx, newClient(victim.url(), oneShotHTTP()), victim.id,
			"stream via the doomed data plane "+itoa(i)+": "+text(seedOf("dpkill-a", itoa(i)), 300), tokens))
		theirs = append(theirs, startStream(ctx, newClient(other.url(), oneShotHTTP()), other.id,
			"stream via the surviving data plane "+itoa(i)+": "+text(seedOf("dpkill-b", itoa(i)), 300), tokens))
	}
	all := append(slices.Clone(mine), theirs...)
	defer waitDone(all, 20*time.Second)
	if !waitStarted(all, 10*time.Second) {
		t.Fatal("streams did not all start within 10 s")
	}
	leader := e.waitLeader(t, 5*time.Second)
	testkit.WaitForMsg(t, 3*time.Second, "the leader counting every open stream", func() (bool, string) {
		n := sumLoad(e.listWorkers(t))
		return n == 2*perDP, fmt.Sprint("load ", n)
	})
	st, err := e.status(leader)
	if err != nil {
		t.Fatal(err)
	}
	dpsBefore := st.GetDataplanes()

	killAt := time.Now()
	victim.Kill()
	defer func() {
		victim.Start(t)
		e.waitReady(t, victim, urlsOf(e.slow))
	}()
	var drained time.Duration
	loadAtKill := -1
	for time.Since(killAt) < loadLeaseSecs*time.Second+10*time.Second {
		st, err := e.status(leader)
		if err == nil && st.GetState() != "leader" {
			// A new leader starts with empty soft state: the drain below
			// would prove nothing.
			t.Fatalf("%s lost leadership during the data-plane kill (term %d); cannot judge the lease", leader.id, st.GetTerm())
		}
		if err == nil && st.GetDataplanes() < dpsBefore {
			drained = time.Since(killAt)
			break
		}
		if loadAtKill < 0 {
			loadAtKill = sumLoad(e.listWorkers(t))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if drained == 0 {
		t.Fatalf("the leader still counts %s %v after its SIGKILL (lease %d s)", victim.id, time.Since(killAt).Round(time.Millisecond), loadLeaseSecs)
	}
	if !waitDone(all, 15*time.Second) {
		t.Fatal("streams did not end within 15 s")
	}
	for _, s := range mine {
		if s.ok() {
			t.Errorf("a stream through the killed %s completed (%d chunks, finish %q)", victim.id, s.chunks, s.finish)
		}
	}
	var firstErr error
	for _, s := range mine {
		if s.err != nil {
			firstErr = s.err
			break
		}
	}
	for _, s := range theirs {
		if !s.ok() {
			t.Errorf("a stream through the surviving %s failed: err %v, %d chunks, finish %q", other.id, s.err, s.chunks, s.finish)
		}
	}
	// With the survivor's streams settled, nothing of the dead one's share
	// may be left.
	testkit.WaitForMsg(t, 5*time.Second, "the leader's load view to be empty", func() (bool, string) {
		n := sumLoad(e.listWorkers(t))
		return n == 0, fmt.Sprint("load ", n)
	})
	// The leader sweeps every lease/4, so a share lapses at most lease +
	// lease/4 after the data plane's last report (which precedes the kill).
	limit := loadLeaseSecs*time.Second*5/4 + 500*time.Millisecond
	t.Logf("%s killed with %d streams open (leader load %d just after); its share left the leader's view after %v (lease %d s, limit %v); client error on its streams: %v",
		victim.id, perDP, loadAtKill, drained.Round(time.Millisecond), loadLeaseSecs, limit, firstErr)
	if drained > limit {
		t.Errorf("the dead data plane's load left the view after %v, want within its lease (%v incl. sweep period and slack)", drained, limit)
	}
}

// 5. `cartctl workers remove` during streams: no new request reaches the
// removed replica, and the streams it was serving finish successfully.
func testRemoveWorker(t *testing.T, e *env) {
	e.setWorkers(t, urlsOf(e.slow))
	for _, r := range e.slow {
		r.s.Reset()
	}
	const n, tokens = 6, 150
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := newClient(e.fe["dp2"], oneShotHTTP())
	prefixes := make([]string, n)
	var ss []*stream
	for i := range n {
		prefixes[i] = groupPrefix("remove", i, 600)
		ss = append(ss, startStream(ctx, c, "haproxy", prefixes[i]+suffix("remove", i, 0), tokens))
	}
	defer waitDone(ss, 20*time.Second)
	if !waitStarted(ss, 10*time.Second) {
		t.Fatal("streams did not all start within 10 s")
	}
	per := map[string]int{}
	for _, s := range ss {
		per[s.replica]++
	}
	var victim *replica
	for _, r := range e.slow {
		if victim == nil || per[r.name] > per[victim.name] {
			victim = r
		}
	}
	if per[victim.name] == 0 {
		t.Fatalf("no stream landed on a slow replica: %v", per)
	}

	e.cartctl(t, "workers", "remove", victim.url)
	removed := time.Now()
	atRemoval := victim.s.Stats()
	var open []*stream
	for _, s := range ss {
		if s.replica != victim.name {
			continue
		}
		select {
		case <-s.done:
			t.Fatalf("a stream on %s had already ended when the removal was acknowledged; the test needs longer streams", victim.name)
		default:
		}
		open = append(open, s)
	}
	var listed struct {
		Workers []struct {
			URL string `json:"url"`
		} `json:"workers"`
	}
	out := e.cartctl(t, "workers", "list", "-o", "json")
	if err := json.Unmarshal([]byte(out), &listed); err != nil {
		t.Fatalf("cartctl workers list -o json: %v\n%s", err, out)
	}
	for _, w := range listed.Workers {
		if w.URL == victim.url {
			t.Fatalf("cartctl workers list still shows the removed %s", victim.url)
		}
	}
	if len(listed.Workers) != len(e.slow)-1 {
		t.Errorf("cartctl workers list -o json shows %d workers, want %d:\n%s", len(listed.Workers), len(e.slow)-1, out)
	}
	// Removing it again is "not found", exit code 3.
	if _, stderr, code := e.cartctlRun(t, "workers", "remove", victim.url); code != 3 {
		t.Errorf("second `cartctl workers remove` exited %d, want 3 (not found); stderr: %s", code, stderr)
	}

	// New requests, many reusing prefixes the index placed on the removed
	// replica, through HAProxy and directly to every data plane.
	var sent atomic.Int64
	check := func(base, via string, i int) {
		r := chat(ctx, newClient(base, oneShotHTTP()), prefixes[i%n]+suffix("remove", i%n, 100+i), 2)
		sent.Add(1)
		if r.err != nil {
			t.Errorf("request via %s after the removal: %v", via, r.err)
		} else if r.replica == victim.name {
			t.Errorf("request via %s reached the removed replica %s", via, victim.name)
		}
	}
	runBounded(30, 3, func(i int) { check(e.fe["dp2"], "HAProxy", i) })
	for _, d := range e.liveDPs() {
		runBounded(6, 3, func(i int) { check(d.url(), d.id, i) })
	}
	after := victim.s.Stats()
	t.Logf("removed %s with %d streams on it (running %d); %d new requests afterwards, %d reached it",
		victim.name, len(open), atRemoval.Running, sent.Load(), after.Requests-atRemoval.Requests)
	if after.Requests != atRemoval.Requests {
		t.Errorf("the removed replica received %d new requests after `cartctl workers remove` returned", after.Requests-atRemoval.Requests)
	}
	if !waitDone(ss, 15*time.Second) {
		t.Fatal("streams did not end within 15 s")
	}
	for _, s := range ss {
		if !s.ok() {
			t.Errorf("stream on %s failed: err %v, %d chunks, finish %q", s.replica, s.err, s.chunks, s.finish)
		}
	}
	t.Logf("in-flight streams on the removed replica finished %v after the removal", time.Since(removed).Round(time.Millisecond))
}

// Route overhead: the same tiny request, sequentially, straight to a fast
// replica, through an all-in-one router and through a data plane asking
// the control plane. The data plane minus the all-in-one is the cost of
// the Route RPC (plus its bookkeeping).
func testRouteLatency(t *testing.T, e *env) {
	e.setWorkers(t, []string{e.latRep.url})
	dp := e.dps[1]
	targets := []struct{ name, base string }{
		{"replica", e.latRep.url},
		{"all-in-one", e.aioLat.url()},
		{"data plane", dp.url()},
	}
	hc := keepAliveHTTP()
	do := func(base string, i int) (time.Duration, error) {
		body := fmt.Sprintf(`{"model":"cart-sim","max_tokens":1,"messages":[{"role":"user","content":"latency probe %d"}]}`, i)
		start := time.Now()
		resp, err := hc.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			return 0, err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		d := time.Since(start)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		return d, err
	}
	fb0 := e.fallbackSum(t, []*httpNode{dp})
	const warm, n = 20, 300
	lat := make([][]time.Duration, len(targets))
	for i := 0; i < warm+n; i++ {
		for k := range targets {
			// Rotate the order so no target always runs right after another.
			tg := (i + k) % len(targets)
			d, err := do(targets[tg].base, i)
			if err != nil {
				t.Fatalf("%s request %d: %v", targets[tg].name, i, err)
			}
			if i >= warm {
				lat[tg] = append(lat[tg], d)
			}
		}
	}
	fb := e.fallbackSum(t, []*httpNode{dp}) - fb0
	for k, tg := range targets {
		t.Logf("%-10s p50 %8v  p99 %8v  (%d sequential requests)", tg.name,
			percentile(lat[k], 0.50).Round(time.Microsecond), percentile(lat[k], 0.99).Round(time.Microsecond), len(lat[k]))
	}
	aio, dpl := lat[1], lat[2]
	t.Logf("Route added latency (data plane - all-in-one): p50 %v, p99 %v; fallbacks during the run: %v",
		(percentile(dpl, 0.50) - percentile(aio, 0.50)).Round(time.Microsecond),
		(percentile(dpl, 0.99) - percentile(aio, 0.99)).Round(time.Microsecond), fb)
}
