// Package enginemetrics reads how busy an inference engine is from its own
// Prometheus metrics: the requests it runs and the requests waiting in its
// queue. Flow control learns each worker's concurrency from them
// (engine.ObserveEngine). Parse is pure; Scraper is the I/O at the edge.
package enginemetrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/cartrouter/cart/controlplane/engine"
)

// MaxBytes bounds one metrics answer: vLLM's is a few hundred KiB with
// histograms; a larger one is cut (and then fails to parse) rather than
// held in memory.
const MaxBytes = 4 << 20

// names are the gauges engines export, running first, then waiting:
// vLLM (and llm-d-inference-sim, and cart-sim), then SGLang.
var names = []struct{ running, waiting string }{
	{"vllm:num_requests_running", "vllm:num_requests_waiting"},
	{"sglang:num_running_reqs", "sglang:num_queue_reqs"},
}

// ErrNoMetrics: the text holds neither vLLM's nor SGLang's gauges.
var ErrNoMetrics = errors.New("no vllm:num_requests_running/waiting or sglang:num_running_reqs/num_queue_reqs gauges")

// Parse reads an engine's Prometheus text exposition. Series of one
// gauge (one per model, or per data-parallel engine) are summed: the
// worker is the whole engine behind its URL.
func Parse(r io.Reader) (engine.EngineLoad, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(io.LimitReader(r, MaxBytes))
	if err != nil {
		return engine.EngineLoad{}, fmt.Errorf("parse engine metrics: %w", err)
	}
	for _, n := range names {
		run, okR := sum(fams[n.running])
		wait, okW := sum(fams[n.waiting])
		if okR && okW {
			return engine.EngineLoad{Running: run, Waiting: wait}, nil
		}
	}
	return engine.EngineLoad{}, ErrNoMetrics
}

func sum(f *dto.MetricFamily) (int, bool) {
	if f == nil || len(f.GetMetric()) == 0 {
		return 0, false
	}
	total := 0.0
	for _, m := range f.GetMetric() {
		var v float64
		switch {
		case m.GetGauge() != nil:
			v = m.GetGauge().GetValue()
		case m.GetUntyped() != nil:
			v = m.GetUntyped().GetValue()
		case m.GetCounter() != nil:
			v = m.GetCounter().GetValue()
		default:
			continue
		}
		if v > 0 && v < 1e9 { // NaN, negative and absurd values count as 0
			total += v
		}
	}
	return int(total + 0.5), true
}

// Scraper reads every worker's metrics each Interval and hands what it
// read to Observe.
type Scraper struct {
	Client   *http.Client
	Path     string
	Interval time.Duration
	Timeout  time.Duration
	// Workers lists the worker URLs to read (called every round).
	Workers func() []string
	// Key is the key a worker expects (sent as a bearer token), "" none.
	Key func(worker string) string
	// Observe takes what was read and returns the worker's learned limit
	// before and after it (a change is logged: an operator sees the limit
	// flow control holds each engine to, and every probe past it).
	Observe func(worker string, l engine.EngineLoad) (before, after int)
	Log     *slog.Logger

	mu     sync.Mutex
	warned map[string]bool // workers whose failure was logged (once until they answer)
}

// Run scrapes until ctx ends.
func (s *Scraper) Run(ctx context.Context) {
	t := time.NewTicker(s.Interval)
	defer t.Stop()
	for {
		s.Round(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Round reads every worker once (a probed one twice, below), concurrently,
// and returns when all answered or timed out.
//
// A read that raised a worker's limit (a probe) is followed by another a
// tenth of an Interval later: the request the raise let through reaches
// the engine at once, and if the engine had no room for it, it waits in
// the engine's queue, where priority and fairness no longer apply, with
// every request sent there after it, until a read shows it. The second
// read ends that after a tenth of the time.
func (s *Scraper) Round(ctx context.Context) {
	var wg sync.WaitGroup
	for _, w := range s.Workers() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !s.readOnce(ctx, w) {
				return
			}
			t := time.NewTimer(s.Interval / 10)
			defer t.Stop()
			select {
			case <-ctx.Done():
			case <-t.C:
				s.readOnce(ctx, w)
			}
		}()
	}
	wg.Wait()
}

// readOnce reads w and hands the load to Observe; it reports whether the
// read raised w's limit.
func (s *Scraper) readOnce(ctx context.Context, w string) (raised bool) {
	l, err := s.read(ctx, w)
	if err != nil {
		s.report(w, err)
		return false
	}
	s.report(w, nil)
	before, after := s.Observe(w, l)
	if before != after && s.Log != nil {
		s.Log.Info("learned engine concurrency changed", "worker", w, "limit", after,
			"engine_running", l.Running, "engine_waiting", l.Waiting)
	}
	return before > 0 && after > before
}

func (s *Scraper) read(ctx context.Context, worker string) (engine.EngineLoad, error) {
	ctx, cancel := context.WithTimeout(ctx, s.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(worker, "/")+s.Path, nil)
	if err != nil {
		return engine.EngineLoad{}, err
	}
	if s.Key != nil {
		if k := s.Key(worker); k != "" {
			req.Header.Set("Authorization", "Bearer "+k)
		}
	}
	resp, err := s.Client.Do(req)
	if err != nil {
		return engine.EngineLoad{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return engine.EngineLoad{}, fmt.Errorf("GET %s: %s", s.Path, resp.Status)
	}
	return Parse(resp.Body)
}

// report logs a worker's first failure (at DEBUG for an engine without the
// gauges: flow control then relies on declared limits) and its recovery.
func (s *Scraper) report(worker string, err error) {
	if s.Log == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.warned == nil {
		s.warned = map[string]bool{}
	}
	switch {
	case err == nil && s.warned[worker]:
		delete(s.warned, worker)
		s.Log.Info("engine metrics readable again", "worker", worker)
	case err != nil && !s.warned[worker]:
		s.warned[worker] = true
		level := slog.LevelWarn
		if errors.Is(err, ErrNoMetrics) {
			level = slog.LevelDebug
		}
		s.Log.Log(context.Background(), level, "cannot read engine metrics; its concurrency is not learned (declare workers[].max_concurrency)", "worker", worker, "error", err)
	}
}
