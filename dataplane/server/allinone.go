package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/discovery"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/enginemetrics"
	"github.com/cartrouter/cart/controlplane/health"
	"github.com/cartrouter/cart/controlplane/index"
	"github.com/cartrouter/cart/controlplane/kvtruth"
	"github.com/cartrouter/cart/controlplane/models"
	"github.com/cartrouter/cart/controlplane/state"
	"github.com/cartrouter/cart/dataplane/breaker"
	"github.com/cartrouter/cart/dataplane/metrics"
	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/dataplane/router"
	"github.com/cartrouter/cart/internal/tracing"
)

// AllInOne is the single-process router: the data-plane server with the
// routing engine embedded.
type AllInOne struct {
	paths   []string
	log     *slog.Logger
	mu      sync.Mutex // guards cfg during reloads
	cfg     *config.Config
	Router  *router.Local
	Health  *health.Checker
	Break   *breaker.Set
	Metrics *metrics.Metrics
	Proxy   *proxy.Proxy
	HTTP    *http.Server
	// MetricsHTTP serves /metrics on server.metrics_addr; nil when unset.
	MetricsHTTP *http.Server
	// discovered are the workers discovery (DNS, Kubernetes) added
	// (guarded by mu); a reload of the static list keeps them.
	discovered map[string]engine.WorkerSpec
	watchers   []*discovery.Watcher

	// Models is which models each worker serves (declared and probed).
	Models *models.Registry
	// kvMetrics are the KV event consumer's metrics (nil without sources).
	kvMetrics *kvtruth.Metrics

	// Tracer traces requests (nil: off); ownTracer: Run shuts it down.
	Tracer    *tracing.Tracer
	ownTracer bool
}

// WorkerSpecs converts configured workers for the engine.
func WorkerSpecs(ws []config.Worker, blockChars int) []engine.WorkerSpec {
	out := make([]engine.WorkerSpec, len(ws))
	for i, w := range ws {
		role, _ := engine.ParseRole(w.Role) // validated
		out[i] = engine.WorkerSpec{URL: w.URL, MaxLoad: w.MaxLoad, MaxConcurrency: w.MaxConcurrency, LoadPenalty: w.LoadPenalty,
			CapacityBlocks: index.CapacityBlocks(w.CacheCapacityTokens, blockChars), Source: state.SourceStatic, Role: role}
	}
	return out
}

// ModelWorkers lists configured workers with their declared models.
func ModelWorkers(ws []config.Worker) []models.Worker {
	out := make([]models.Worker, len(ws))
	for i, w := range ws {
		out[i] = models.Worker{URL: w.URL, Declared: w.Models}
	}
	return out
}

func workerURLs(ws []config.Worker) []string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = w.URL
	}
	return out
}

// NewAllInOne builds the all-in-one router from a validated config. paths
// are kept for SIGHUP reloads.
func NewAllInOne(cfg *config.Config, paths []string, log *slog.Logger, seed uint64, opts ...Option) (_ *AllInOne, err error) {
	a := &AllInOne{paths: paths, log: log, cfg: cfg, discovered: map[string]engine.WorkerSpec{}}
	if a.Tracer, a.ownTracer, err = tracing.ForRole(cfg, config.RoleAllInOne, "", opts, log); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil && a.ownTracer {
			_ = a.Tracer.Close()
		}
	}()
	a.Router = router.NewLocal(router.LocalOptions{
		Policy:      decider.PolicyFrom(cfg),
		MaxEntries:  cfg.Cache.MaxTreeSize,
		InlineEvict: cfg.Cache.EvictionIntervalSecs <= 0,
		CleanupHour: cfg.Cache.DailyCleanupHourUTC,
		Seed:        seed,
		Flow:        decider.FlowFrom(cfg),
	}, WorkerSpecs(cfg.Workers, cfg.Cache.BlockChars))
	a.Metrics = metrics.New(func() (int, uint64, uint64, uint64) {
		st, under := a.Router.IndexStats()
		return st.Entries, st.Evicted, st.SkippedInserts, under
	})
	// The routing core's lock-hold histogram, as on a control-plane node.
	a.Metrics.Registry.MustRegister(a.Router.Collectors()...)
	a.Break = breaker.NewSet(BreakerConfig(cfg), func(t breaker.Transition) {
		a.Metrics.SetBreaker(t.Worker, t.To.String())
		a.Metrics.BreakerTrans.WithLabelValues(t.Worker, t.To.String()).Inc()
		log.Warn("circuit breaker", "worker", t.Worker, "from", t.From.String(), "to", t.To.String())
	})
	a.Models = models.New()
	a.Models.SetWorkers(ModelWorkers(cfg.Workers))
	hc := health.ConfigFrom(cfg.Health)
	hc.Models, hc.ModelsEndpoint = models.Learner(a.Models, log), models.Path
	// Through the proxy, so that a reload's new worker keys reach probes
	// too; the pool key only to workers of the sources trusted with it.
	hc.WorkerKey = a.workerKey
	a.Health = health.NewChecker(hc, nil, func(w string, healthy bool, reason string) {
		a.Router.SetHealthy(w, healthy)
		a.Metrics.SetHealthy(w, healthy)
		if healthy {
			a.Break.HealthRecovered(w)
		}
		log.Warn("worker health changed", "worker", w, "healthy", healthy, "reason", reason)
	})
	a.Health.SetWorkers(workerURLs(cfg.Workers))
	for _, w := range cfg.Workers {
		a.Metrics.SetHealthy(w.URL, true)
		a.Metrics.SetBreaker(w.URL, "closed")
	}
	if a.Proxy, a.HTTP, a.MetricsHTTP, err = newFront(cfg, a.Router, a.Break, a.Metrics, a.Models, a.Tracer, log); err != nil {
		return nil, err
	}
	if len(kvtruth.SourcesFrom(cfg)) > 0 {
		a.kvMetrics = kvtruth.NewMetrics(a.Metrics.Registry)
	}
	if a.watchers, err = discovery.Watchers(cfg, log, discovery.NewMetrics(a.Metrics.Registry),
		func(source string) discovery.Sink { return aioSink{a, source} }, cfg.Listeners(config.RoleAllInOne)...); err != nil {
		return nil, err
	}
	return a, nil
}

// aioSink applies one source's discovery to the embedded engine.
type aioSink struct {
	a      *AllInOne
	source string
}

func (s aioSink) Pool() map[string]string {
	ws := s.a.Router.Workers()
	out := make(map[string]string, len(ws))
	for _, w := range ws {
		out[w.URL] = w.Source
	}
	return out
}

func (s aioSink) Add(_ context.Context, url, role string) error {
	a := s.a
	a.mu.Lock()
	defer a.mu.Unlock()
	maxLoad, penalty, capTokens := discovery.Defaults(a.cfg, s.source)
	r, err := engine.ParseRole(role)
	if err != nil {
		return err
	}
	a.discovered[url] = engine.WorkerSpec{URL: url, MaxLoad: maxLoad, LoadPenalty: penalty,
		CapacityBlocks: index.CapacityBlocks(capTokens, a.cfg.Cache.BlockChars), Source: s.source, Role: r}
	a.applyWorkersLocked(a.cfg)
	return nil
}

func (s aioSink) Remove(_ context.Context, url string) error {
	a := s.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if w, ok := a.discovered[url]; ok && w.Source == s.source {
		delete(a.discovered, url)
		a.applyWorkersLocked(a.cfg)
	}
	return nil
}

func (s aioSink) SetDraining(url string, on bool) { s.a.Router.SetDraining(url, on) }
func (s aioSink) Load(url string) int             { return s.a.Router.Load(url) }

// Run serves on ln until ctx ends, with health checks and index
// maintenance running alongside.
func (a *AllInOne) Run(ctx context.Context, ln net.Listener) error {
	return a.serve(ctx, ln, func(*config.Config) httpServer { return stdServer{a.HTTP} }, "cart all-in-one router listening")
}

// serve runs the server front builds on ln (the proxy's HTTP server, or an
// endpoint picker's gRPC one), with everything else that runs alongside,
// and extra tasks.
func (a *AllInOne) serve(ctx context.Context, ln net.Listener, front func(*config.Config) httpServer, listening string, extra ...func(context.Context)) error {
	if a.ownTracer {
		defer closeTracer(a.Tracer, a.log)
	}
	// A SIGHUP reload may replace a.cfg at any time, even now.
	a.mu.Lock()
	cfg := a.cfg
	a.mu.Unlock()
	mln, err := openMetrics(cfg, ln, a.MetricsHTTP, a.log)
	if err != nil {
		return err
	}
	if a.kvMetrics != nil {
		// The engines' KV events, once per engine, in process.
		kv, err := kvtruth.Start(kvtruth.OptionsFrom(cfg, a.Router, a.kvMetrics, a.log))
		if err != nil {
			_ = ln.Close()
			return err
		}
		defer kv.Close()
	}
	tasks := []func(context.Context){
		a.Health.Run,
		func(ctx context.Context) { a.Router.Run(ctx, config.Seconds(cfg.Cache.EvictionIntervalSecs)) },
	}
	if cfg.Flow.Enabled && cfg.Flow.LearnConcurrency {
		tasks = append(tasks, a.engineScraper(cfg).Run)
	}
	for _, w := range a.watchers {
		tasks = append(tasks, w.Run)
	}
	tasks = append(tasks, extra...)
	a.log.Info(listening, "addr", ln.Addr().String(), "workers", len(cfg.Workers))
	return serveAlongside(ctx, front(cfg), ln, config.Seconds(cfg.Server.ShutdownGraceSecs), a.MetricsHTTP, mln, a.log, tasks...)
}

// Reload re-reads the config files. Only the worker list may change; any
// other difference rejects the reload and the running config stays. Kept
// workers keep their index entries (the cache stays warm), removed workers'
// entries are dropped, and requests in flight to removed workers finish.
func (a *AllInOne) Reload() error {
	next, err := config.Load(a.paths...)
	if err == nil {
		err = next.Validate(config.RoleAllInOne)
	}
	if err != nil {
		a.Metrics.Reloads.WithLabelValues("rejected").Inc()
		return fmt.Errorf("reload rejected: %w", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var other []string
	for _, k := range config.DiffKeys(a.cfg, next) {
		if k != "workers" && !strings.HasPrefix(k, "workers.") && !strings.HasPrefix(k, "workers[") {
			other = append(other, k)
		}
	}
	if kvEventsChanged(a.cfg, next) {
		other = append(other, "workers[].kv_events")
	}
	if len(other) > 0 {
		a.Metrics.Reloads.WithLabelValues("rejected").Inc()
		return fmt.Errorf("reload rejected: only workers may change at runtime, but these keys differ: %s (restart to apply them)", strings.Join(other, ", "))
	}
	wk, err := WorkerKeys(next)
	if err != nil {
		a.Metrics.Reloads.WithLabelValues("rejected").Inc()
		return fmt.Errorf("reload rejected: %w", err)
	}
	a.Proxy.SetWorkerKeys(wk)
	removed := a.applyWorkersLocked(next)
	a.cfg = next
	a.Metrics.Reloads.WithLabelValues("accepted").Inc()
	a.log.Info("config reloaded", "workers", len(next.Workers), "removed", removed)
	return nil
}

// applyWorkersLocked makes the engine's set the static workers of cfg plus
// the discovered ones (a static worker wins a URL both name), keeping kept
// workers' cache entries, load and breakers. Callers hold a.mu.
func (a *AllInOne) applyWorkersLocked(cfg *config.Config) (removed []string) {
	before := make(map[string]bool)
	for _, w := range a.Router.Workers() {
		before[w.URL] = true
	}
	specs := WorkerSpecs(cfg.Workers, cfg.Cache.BlockChars)
	static := make(map[string]bool, len(specs))
	for _, s := range specs {
		static[s.URL] = true
	}
	for _, s := range a.discovered {
		if !static[s.URL] {
			specs = append(specs, s)
		}
	}
	// Map order must not reorder the workers between applies.
	slices.SortStableFunc(specs[len(cfg.Workers):], func(x, y engine.WorkerSpec) int { return strings.Compare(x.URL, y.URL) })
	// The model registry first: a worker must never be routable (or its
	// models read) before the registry knows it.
	// Discovered workers declare no models: what they serve is probed.
	mw := ModelWorkers(cfg.Workers)
	for _, s := range specs[len(cfg.Workers):] {
		mw = append(mw, models.Worker{URL: s.URL})
	}
	a.Models.SetWorkers(mw)
	removed = a.Router.SetWorkers(specs)
	urls := make([]string, len(specs))
	for i, s := range specs {
		urls[i] = s.URL
	}
	a.Health.SetWorkers(urls)
	keep := make(map[string]bool, len(urls))
	for _, u := range urls {
		keep[u] = true
		if !before[u] {
			// Added workers start healthy with a closed breaker, as at start.
			a.Metrics.SetHealthy(u, true)
			a.Metrics.SetBreaker(u, "closed")
		}
	}
	a.Break.Forget(keep)
	for _, w := range removed {
		a.Metrics.Healthy.DeleteLabelValues(w)
		a.Metrics.BreakerState.DeletePartialMatch(map[string]string{"worker": w})
	}
	return removed
}

// engineScraper reads the engines' metrics for flow control's learned
// concurrency, with the workers' keys.
func (a *AllInOne) engineScraper(cfg *config.Config) *enginemetrics.Scraper {
	return &enginemetrics.Scraper{
		Client:   &http.Client{Transport: http.DefaultTransport},
		Path:     cfg.Flow.MetricsEndpoint,
		Interval: config.Seconds(cfg.Flow.MetricsIntervalSecs),
		Timeout:  min(config.Seconds(cfg.Flow.MetricsIntervalSecs), config.Seconds(cfg.Health.TimeoutSecs)),
		Workers: func() []string {
			ws := a.Router.Workers()
			out := make([]string, len(ws))
			for i, w := range ws {
				out[i] = w.URL
			}
			return out
		},
		Key:     a.workerKey,
		Observe: a.Router.ObserveEngine,
		Log:     a.log,
	}
}

// workerKey is the key a probe of worker w sends: its own, or the pool's
// if its source is trusted with it.
func (a *AllInOne) workerKey(w string) string {
	src, ok := a.Router.WorkerSource(w)
	if !ok {
		return ""
	}
	return a.Proxy.WorkerKey(w, src)
}
