package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cartrouter/cart/controlplane/index"
	"github.com/cartrouter/cart/dataplane/remote"
	"github.com/cartrouter/cart/dataplane/router"
	"github.com/cartrouter/cart/internal/prefixload"
)

// FailoverConfig is the leader-kill benchmark (the measurement of
// bench/results/2026-12-01-failover, on processes): a prefix-group workload
// whose workers' caches are modelled as LRUs, so that the hit ratio of a
// window says how cache-aware routing stayed.
type FailoverConfig struct {
	Runs int `json:"runs"`
	// Unary: the data planes make one call per Route (no stream).
	Unary bool `json:"unary,omitempty"`
	// NoPlacementFeed turns off dataplane.route_stream_placement_feed.
	NoPlacementFeed bool `json:"no_placement_feed,omitempty"`
	DataPlanes      int  `json:"dataplanes"`
	// NodeProcs is each control-plane node's GOMAXPROCS (0: Go's default);
	// see DefaultNodeProcs.
	NodeProcs int `json:"node_procs"`
	// Clients each keep two requests open and pause Pace between requests.
	Clients int           `json:"clients"`
	Pace    time.Duration `json:"pace_ns"`
	// Window is the length of the steady window (just before the kill),
	// the kill window (starting with it) and the window after it.
	Window time.Duration `json:"window_ns"`
	// Settle is the load before the steady window: placements spread by
	// the balance rule and caches full, so two windows without a kill
	// compare equal.
	Settle time.Duration `json:"settle_ns"`
	// Groups shared prefixes; each worker's cache holds CacheGroups.
	Groups      int `json:"groups"`
	CacheGroups int `json:"cache_groups"`
	// WarmRequests go through one client before the load starts.
	WarmRequests int           `json:"warm_requests"`
	RouteTimeout time.Duration `json:"route_timeout_ns"` // 0: the config default
	StartTimeout time.Duration `json:"start_timeout_ns"`
}

// DefaultFailoverConfig is the earlier measurement's set-up: 40 groups of
// ~100-character keys (six 16-character blocks), four workers caching 12
// groups each, two data planes, eight clients (~700-1,000 routes/s), 6 s
// windows; one run takes about 35 s.
func DefaultFailoverConfig() FailoverConfig {
	return FailoverConfig{Runs: 1, DataPlanes: 2, Clients: 8, Pace: 5 * time.Millisecond, Window: 6 * time.Second, Settle: 6 * time.Second,
		Groups: 40, CacheGroups: 12, WarmRequests: 200, NodeProcs: DefaultNodeProcs, StartTimeout: 30 * time.Second}
}

// Validate refuses settings that would measure nothing or never end.
func (c FailoverConfig) Validate() error {
	switch {
	case c.Runs < 1 || c.Runs > 100:
		return fmt.Errorf("failover benchmark: runs %d out of range 1..100", c.Runs)
	case c.DataPlanes < 1 || c.DataPlanes > 64:
		return fmt.Errorf("failover benchmark: dataplanes %d out of range 1..64", c.DataPlanes)
	case c.Clients < 1 || c.Clients > 10_000:
		return fmt.Errorf("failover benchmark: clients %d out of range 1..10000", c.Clients)
	case c.Window <= 0 || c.Window > 10*time.Minute:
		return fmt.Errorf("failover benchmark: window %s out of range (0, 10m]", c.Window)
	case c.Settle < 0 || c.Settle > 10*time.Minute:
		return fmt.Errorf("failover benchmark: settle %s out of range [0, 10m]", c.Settle)
	case c.Pace < 0 || c.RouteTimeout < 0:
		return errors.New("failover benchmark: negative pace or route timeout")
	case c.Groups < 1 || c.CacheGroups < 1:
		return errors.New("failover benchmark: groups and cache groups must be positive")
	}
	return checkNodeProcs("failover", c.NodeProcs)
}

// FailoverWindow is what the data planes decided during one window.
type FailoverWindow struct {
	Requests  int `json:"requests"`
	Fallbacks int `json:"fallbacks"`
	Errors    int `json:"errors"`
	// Repeats are requests whose group was seen before; Hits those of them
	// that landed on a worker caching the group.
	Repeats int `json:"repeats"`
	Hits    int `json:"hits"`
}

// HitRatio is Hits/Repeats (0 without repeats).
func (w FailoverWindow) HitRatio() float64 { return float64(w.Hits) / float64(max(1, w.Repeats)) }

// FallbackShare is Fallbacks/Requests.
func (w FailoverWindow) FallbackShare() float64 {
	return float64(w.Fallbacks) / float64(max(1, w.Requests))
}

// FailoverRun is one leader kill.
type FailoverRun struct {
	Steady FailoverWindow `json:"steady"`
	Window FailoverWindow `json:"kill_window"`
	Post   FailoverWindow `json:"next_window"`
	// Ratio is the kill window's hit ratio over the steady window's.
	Ratio  float64 `json:"window_over_steady"`
	Killed string  `json:"killed"`
	// ElectionS is from the kill until a surviving node said it leads;
	// FirstLeaderRouteS until the first Route, sent after the kill, that
	// the control plane answered. -1: not within the kill window.
	ElectionS         float64 `json:"election_s"`
	FirstLeaderRouteS float64 `json:"first_leader_route_s"`
	// BeforeLeader and AfterLeader split the kill window at that route.
	BeforeLeader FailoverWindow `json:"before_leader_route"`
	AfterLeader  FailoverWindow `json:"after_leader_route"`
	// Causes are the data planes' fallback causes in the kill window.
	Causes  map[string]int `json:"fallback_causes,omitempty"`
	LoadAvg string         `json:"loadavg"`
	Error   string         `json:"error,omitempty"`
}

// FailoverResult is the failover section.
type FailoverResult struct {
	Config  FailoverConfig `json:"config"`
	Runs    []FailoverRun  `json:"runs"`
	Skipped string         `json:"skipped,omitempty"`
}

const failoverBlockChars = 16

// foRecord is one decision.
type foRecord struct {
	start, end             time.Time
	fallback, err          bool
	repeat, hit            bool
	answeredByControlPlane bool
}

type foCause struct {
	at    time.Time
	cause string
}

// foLog collects decisions and fallback causes from every client.
type foLog struct {
	mu      sync.Mutex
	records []foRecord
	causes  []foCause
}

func (l *foLog) add(r foRecord) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r)
}

func (l *foLog) cause(c string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.causes = append(l.causes, foCause{time.Now(), c})
}

func (w *FailoverWindow) add(r foRecord) {
	w.Requests++
	switch {
	case r.err:
		w.Errors++
		return
	case r.fallback:
		w.Fallbacks++
	}
	if r.repeat {
		w.Repeats++
		if r.hit {
			w.Hits++
		}
	}
}

// foDrive sends the workload through the data planes (request i through
// dps[i%len(dps)]) from clients concurrent clients until done(i), each
// keeping two requests open (a request completes two decisions later) and
// pausing pace in between.
func foDrive(ctx context.Context, dps []*remote.Router, wl *prefixload.Workload, model string, clients int, pace time.Duration, done func(i int) bool, log *foLog) {
	const inFlight = 2
	type open struct {
		r *remote.Router
		d router.Decision
	}
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var held []open
			for i := c; !done(i) && ctx.Err() == nil; i += clients {
				r := dps[i%len(dps)]
				g, key := wl.Next()
				rec := foRecord{start: time.Now()}
				d, err := r.Decide(ctx, &router.Request{Model: model, Hashes: index.Hash(nil, model, []byte(key), failoverBlockChars), KeyLen: len(key)})
				rec.end = time.Now()
				if err != nil {
					rec.err = true
				} else {
					rec.fallback = d.Reason == remote.ReasonFallbackLocal
					rec.answeredByControlPlane = !rec.fallback && d.FromLeader
					rec.repeat, rec.hit = wl.Landed(g, d.Worker)
					held = append(held, open{r, d})
				}
				log.add(rec)
				if len(held) > inFlight {
					settle(held[0].r, held[0].d, true)
					held = held[1:]
				}
				if pace > 0 {
					time.Sleep(pace)
				}
			}
			for _, o := range held {
				settle(o.r, o.d, true)
			}
		}()
	}
	wg.Wait()
}

// summarizeFailover classifies the decisions by when they were sent
// relative to the kill: the window before it, the one starting with it and
// the one after; electedAt is zero when no survivor led within the run.
func summarizeFailover(records []foRecord, causes []foCause, kill, electedAt time.Time, window time.Duration) FailoverRun {
	var r FailoverRun
	r.ElectionS, r.FirstLeaderRouteS = -1, -1
	if !electedAt.IsZero() && electedAt.Sub(kill) < window {
		r.ElectionS = electedAt.Sub(kill).Seconds()
	}
	sorted := slices.Clone(records)
	sort.Slice(sorted, func(a, b int) bool { return sorted[a].end.Before(sorted[b].end) })
	var first time.Time
	for _, x := range sorted {
		if !x.start.Before(kill) && x.answeredByControlPlane && x.end.Sub(kill) < window {
			first = x.end
			r.FirstLeaderRouteS = first.Sub(kill).Seconds()
			break
		}
	}
	for _, x := range records {
		switch d := x.start.Sub(kill); {
		case d < -window:
		case d < 0:
			r.Steady.add(x)
		case d < window:
			r.Window.add(x)
			if !first.IsZero() && !x.start.Before(first) {
				r.AfterLeader.add(x)
			} else {
				r.BeforeLeader.add(x)
			}
		case d < 2*window:
			r.Post.add(x)
		}
	}
	for _, c := range causes {
		if d := c.at.Sub(kill); d >= 0 && d < window {
			if r.Causes == nil {
				r.Causes = map[string]int{}
			}
			r.Causes[c.cause]++
		}
	}
	if s := r.Steady.HitRatio(); s > 0 {
		r.Ratio = r.Window.HitRatio() / s
	}
	return r
}

// RunFailover runs cfg.Runs leader kills, each on a fresh cluster.
func RunFailover(ctx context.Context, env *Env, cfg FailoverConfig) FailoverResult {
	res := FailoverResult{Config: cfg}
	for i := range max(cfg.Runs, 1) {
		if ctx.Err() != nil {
			break
		}
		run, err := failoverOnce(ctx, env, cfg, uint64(i+1))
		if err != nil && run == nil {
			res.Skipped = err.Error()
			return res
		}
		if err != nil {
			run.Error = err.Error()
		}
		res.Runs = append(res.Runs, *run)
		env.Logf("   run %d: %s", i+1, foRunLine(*run))
	}
	return res
}

// failoverOnce is one kill. It returns no run when the cluster or the data
// planes did not start, and a run with an error when the kill went wrong.
func failoverOnce(ctx context.Context, env *Env, cfg FailoverConfig, seed uint64) (*FailoverRun, error) {
	const model = "bench-model"
	// Each worker's cache in the control plane's model is the workload's:
	// CacheGroups groups of about six blocks. Without it the index keeps
	// every placement ever made, and the hit ratio drifts with no fault.
	capTokens := cfg.CacheGroups * 6 * failoverBlockChars / index.CharsPerToken
	const balanceAbs = 4 // the pool is four workers with ~16 requests in flight
	cl, err := startCPCluster(ctx, env, filepath.Join(env.Cfg.BinDir, "cart"), cpClusterSpec{Nodes: 3, Workers: 4, Model: model, StartTimeout: cfg.StartTimeout, Procs: cfg.NodeProcs,
		Base: CartRouterConfig{CacheTokens: capTokens, BlockChars: failoverBlockChars, BalanceAbs: balanceAbs}})
	if err != nil {
		return nil, err
	}
	defer cl.close()
	log := &foLog{}
	dps, err := startDataPlanes(ctx, env, cfg.DataPlanes, 4, func(i int, client *http.Client) remote.Options {
		o := dataPlaneOptions(fmt.Sprintf("dp%d", i+1), cl.urls(), failoverBlockChars, balanceAbs, cfg.RouteTimeout, client, log.cause)
		o.RouteStream = o.RouteStream && !cfg.Unary
		o.PlacementFeed = o.PlacementFeed && !cfg.NoPlacementFeed
		return o
	}, cfg.StartTimeout)
	if err != nil {
		return nil, fmt.Errorf("data planes: %w", err)
	}
	defer dps.stop()
	wl := prefixload.New(cfg.Groups, cfg.CacheGroups, seed)
	// Warm-up: one client, a bounded number of requests.
	foDrive(ctx, dps.routers, wl, model, 1, 0, func(i int) bool { return i >= cfg.WarmRequests }, &foLog{})

	var stopped atomic.Bool
	driven := make(chan struct{})
	go func() {
		defer close(driven)
		foDrive(ctx, dps.routers, wl, model, cfg.Clients, cfg.Pace, func(int) bool { return stopped.Load() }, log)
	}()
	defer func() {
		stopped.Store(true)
		<-driven
	}()
	pause := func(d time.Duration) {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	pause(cfg.Settle)
	// A loaded machine can starve Raft into an election during the
	// settling: the steady window starts from a leader.
	if _, _, err := cl.waitLeader(ctx, 10*time.Second); err != nil {
		return &FailoverRun{LoadAvg: LoadAvg()}, err
	}
	pause(cfg.Window)
	old, _ := cl.leader(ctx)
	if old == nil {
		return &FailoverRun{LoadAvg: LoadAvg()}, errors.New("no leader to kill at the end of the steady window")
	}
	kill := time.Now()
	old.proc.Kill()
	elected := make(chan time.Time, 1)
	go func() {
		deadline := kill.Add(cfg.Window)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			if ld, _ := cl.leader(ctx); ld != nil && ld != old {
				elected <- time.Now()
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		elected <- time.Time{}
	}()
	pause(2 * cfg.Window)
	stopped.Store(true)
	<-driven
	electedAt := <-elected
	log.mu.Lock()
	run := summarizeFailover(log.records, log.causes, kill, electedAt, cfg.Window)
	log.mu.Unlock()
	run.Killed = old.id
	run.LoadAvg = LoadAvg()
	return &run, ctx.Err()
}
