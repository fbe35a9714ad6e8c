// Package health polls each worker's health endpoint and turns consecutive
// results into healthy/unhealthy verdicts with hysteresis: FailureThreshold
// consecutive failures mark a worker unhealthy, SuccessThreshold consecutive
// successes bring it back. One Checker serves a whole pool (in the
// distributed mode it runs on the control-plane leader only).
package health

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// Config mirrors health.* in the configuration.
type Config struct {
	Endpoint         string
	Interval         time.Duration
	Timeout          time.Duration
	FailureThreshold int
	SuccessThreshold int
	// WorkerKey returns the key a worker expects (vLLM --api-key), sent as
	// a bearer token: such a worker answers 401 to an anonymous probe and
	// would be marked down. nil or "" sends none.
	WorkerKey func(worker string) string
	// Models, when set, is handed the body of each worker's 200 answer to
	// GET ModelsEndpoint, fetched on every probe round after the health
	// probe, so the models a worker serves (LoRA adapters loaded at
	// runtime included) are known within one interval. A failed fetch
	// calls nothing: the caller keeps the last list.
	Models         func(worker string, body []byte)
	ModelsEndpoint string
}

// Verdict is called when a worker's health changes. Workers start healthy
// (see NewTracker) and no verdict is reported for that initial state. It
// must not block for long.
type Verdict func(worker string, healthy bool, reason string)

// Tracker is the pure hysteresis state for a set of workers.
type Tracker struct {
	cfg   Config
	state map[string]*track
}

type track struct {
	healthy   bool
	succ, bad int
}

// NewTracker returns a tracker; workers start healthy so that a freshly
// started router serves at once (a dead worker is demoted after
// FailureThreshold probes, and retries cover the gap).
func NewTracker(cfg Config) *Tracker {
	return &Tracker{cfg: cfg, state: make(map[string]*track)}
}

// Observe records one probe result and reports whether the verdict changed
// and the new verdict.
func (t *Tracker) Observe(worker string, ok bool) (changed, healthy bool) {
	s, found := t.state[worker]
	if !found {
		s = &track{healthy: true}
		t.state[worker] = s
	}
	if ok {
		s.bad = 0
		s.succ++
		if !s.healthy && s.succ >= t.cfg.SuccessThreshold {
			s.healthy = true
			return true, true
		}
		return false, s.healthy
	}
	s.succ = 0
	s.bad++
	if s.healthy && s.bad >= t.cfg.FailureThreshold {
		s.healthy = false
		return true, false
	}
	return false, s.healthy
}

// Healthy reports the current verdict (true for unknown workers).
func (t *Tracker) Healthy(worker string) bool {
	if s, ok := t.state[worker]; ok {
		return s.healthy
	}
	return true
}

// Retain forgets workers not in keep.
func (t *Tracker) Retain(keep map[string]bool) {
	for w := range t.state {
		if !keep[w] {
			delete(t.state, w)
		}
	}
}

// Checker probes workers periodically.
type Checker struct {
	cfg     Config
	client  *http.Client
	verdict Verdict

	mu      sync.Mutex
	workers []string
	current map[string]bool // the set of workers, for results of removed ones
	tracker *Tracker
	fresh   []string      // added since the last round: their models are read at once
	kick    chan struct{} // tells Run that fresh is not empty
}

// NewChecker returns a checker; call SetWorkers, then Run. A nil client
// gets a transport that, like the proxy's, ignores HTTP_PROXY and friends:
// probes must reach the workers the way inference traffic does, not through
// an environment proxy (which may not reach them at all and would take the
// whole pool out of service).
func NewChecker(cfg Config, client *http.Client, v Verdict) *Checker {
	if client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.Proxy = nil
		client = &http.Client{Transport: tr}
	}
	return &Checker{cfg: cfg, client: client, verdict: v, tracker: NewTracker(cfg), kick: make(chan struct{}, 1)}
}

// SetWorkers replaces the probed set.
func (c *Checker) SetWorkers(urls []string) {
	keep := make(map[string]bool, len(urls))
	for _, u := range urls {
		keep[u] = true
	}
	c.mu.Lock()
	if c.current != nil && c.cfg.Models != nil {
		// A worker added at runtime (cartctl, discovery, reload) serves
		// nothing as far as model routing knows until its models are read:
		// read them now rather than up to an interval later.
		for _, u := range urls {
			if !c.current[u] {
				c.fresh = append(c.fresh, u)
			}
		}
	}
	c.workers = append([]string(nil), urls...)
	c.current = keep
	c.tracker.Retain(keep)
	kick := len(c.fresh) > 0
	c.mu.Unlock()
	if kick {
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
}

// ReadFresh reads the models of workers added since the last round (Run
// does it by itself; a caller driving Round does it with this).
func (c *Checker) ReadFresh(ctx context.Context) {
	c.mu.Lock()
	fresh := c.fresh
	c.fresh = nil
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, w := range fresh {
		c.mu.Lock()
		still := c.current[w]
		c.mu.Unlock()
		if !still {
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); c.fetchModels(ctx, w) }()
	}
	wg.Wait()
}

// Run probes every worker each interval until ctx ends. Probes of one
// round run concurrently, so one hanging worker does not delay the others.
func (c *Checker) Run(ctx context.Context) {
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		c.Round(ctx)
		if !c.untilTick(ctx, t.C) {
			return
		}
	}
}

// untilTick waits for the next round, reading the models of workers added
// meanwhile; false when ctx ends.
func (c *Checker) untilTick(ctx context.Context, tick <-chan time.Time) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-c.kick:
			c.ReadFresh(ctx)
		case <-tick:
			return true
		}
	}
}

// Round probes every worker once and applies the results.
func (c *Checker) Round(ctx context.Context) {
	c.mu.Lock()
	ws := append([]string(nil), c.workers...)
	c.fresh = nil // this round reads every worker's models
	c.mu.Unlock()
	type result struct {
		w   string
		err error
	}
	results := make(chan result, len(ws))
	for _, w := range ws {
		go func() {
			err := c.probe(ctx, w)
			c.fetchModels(ctx, w)
			results <- result{w, err}
		}()
	}
	for range ws {
		r := <-results
		if ctx.Err() != nil {
			continue // shutting down: a cancelled probe says nothing about the worker
		}
		c.mu.Lock()
		if !c.current[r.w] {
			// Removed (by a reload) while its probe was in flight: a verdict
			// would resurrect its state and its metrics.
			c.mu.Unlock()
			continue
		}
		changed, healthy := c.tracker.Observe(r.w, r.err == nil)
		c.mu.Unlock()
		if changed && c.verdict != nil {
			reason := "ok"
			if r.err != nil {
				reason = r.err.Error()
			}
			c.verdict(r.w, healthy, reason)
		}
	}
}

func (c *Checker) probe(ctx context.Context, worker string) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, worker+c.cfg.Endpoint, nil)
	if err != nil {
		return fmt.Errorf("build probe: %w", err)
	}
	if c.cfg.WorkerKey != nil {
		if k := c.cfg.WorkerKey(worker); k != "" {
			req.Header.Set("Authorization", "Bearer "+k)
		}
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return fmt.Errorf("probe %s: %w", worker, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("probe %s: status %d", worker, resp.StatusCode)
	}
	return nil
}

// maxModelsBody bounds a /v1/models answer (a pool with many adapters has
// long lists, but not megabytes of them).
const maxModelsBody = 8 << 20

func (c *Checker) fetchModels(ctx context.Context, worker string) {
	if c.cfg.Models == nil || c.cfg.ModelsEndpoint == "" {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, worker+c.cfg.ModelsEndpoint, nil)
	if err != nil {
		return
	}
	if c.cfg.WorkerKey != nil {
		if k := c.cfg.WorkerKey(worker); k != "" {
			req.Header.Set("Authorization", "Bearer "+k)
		}
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxModelsBody+1))
	if err != nil || resp.StatusCode != http.StatusOK || len(body) > maxModelsBody || ctx.Err() != nil {
		return
	}
	c.mu.Lock()
	current := c.current[worker]
	c.mu.Unlock()
	if current {
		c.cfg.Models(worker, body)
	}
}
