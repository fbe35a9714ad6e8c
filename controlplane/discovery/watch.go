package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cartrouter/cart/config"
)

// Sink is the worker set a watcher changes. Implementations must be
// idempotent: a change may be applied again after an error or by a new
// control-plane leader.
type Sink interface {
	// Pool maps every worker URL in the set to its source.
	Pool() map[string]string
	// Add puts a discovered worker in the set (source = the watcher's),
	// of role ("" = both).
	Add(ctx context.Context, url, role string) error
	// Remove takes a discovered worker out of the set.
	Remove(ctx context.Context, url string) error
	// SetDraining keeps a worker out of new decisions, or puts it back.
	SetDraining(url string, draining bool)
	// Load is the worker's in-flight request count.
	Load(url string) int
}

// Metrics are the discovery metrics; create them once per process (a
// control-plane node starts a watcher on every leadership it gains).
type Metrics struct {
	Errors  *prometheus.CounterVec
	Stale   *prometheus.GaugeVec
	Changes *prometheus.CounterVec
	Refused *prometheus.CounterVec
}

// NewMetrics registers the discovery metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_discovery_errors_total",
			Help: "Discovery answers that were errors or empty; the last good worker set was kept."}, []string{"source"}),
		Stale: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "cart_discovery_stale",
			Help: "1 while the last discovery answer was unusable and the worker set is the last good one."}, []string{"source"}),
		Changes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_discovery_changes_total",
			Help: "Worker-set changes made by discovery, by change (add, drain, undrain, remove)."}, []string{"source", "change"}),
		Refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_discovery_refused_total",
			Help: "Discovered endpoints refused as workers, counted in every answer that has them, by reason (loopback, link_local, unspecified, multicast, own_listener, not_allowed, invalid)."},
			[]string{"source", "reason"}),
	}
	reg.MustRegister(m.Errors, m.Stale, m.Changes, m.Refused)
	return m
}

// Notifier is a Resolver that knows when its answer may have changed (a
// watch): the watcher then resolves without waiting out its interval.
type Notifier interface {
	Notify() <-chan struct{}
}

// Starter is a Resolver with background work (a Kubernetes informer) that
// lives as long as one watcher run: Start begins it, and the returned stop
// ends it and waits for it, so a leader that steps down leaves nothing
// running.
type Starter interface {
	Start(ctx context.Context) (stop func())
}

// WatchOptions configure a Watcher.
type WatchOptions struct {
	// Source names the workers this watcher owns ("dns", "kubernetes").
	Source   string
	Resolver Resolver
	Sink     Sink
	Rules    Options
	Metrics  *Metrics
	Logger   *slog.Logger
	// Policy refuses endpoints that must not become workers (see
	// AddressPolicy); nil admits every one (tests of the reconciling
	// alone: Watchers always sets one).
	Policy *AddressPolicy
	// SettleEvery is how often draining workers are checked for removal
	// (default 200 ms).
	SettleEvery time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Watcher runs one source until its context ends.
type Watcher struct {
	o WatchOptions
	// roles are the last usable answer's (Answer.Roles), for the adds
	// that follow it; touched by Run's goroutine only.
	roles map[string]string
}

// NewWatcher builds a watcher; Run starts it.
func NewWatcher(o WatchOptions) *Watcher {
	if o.SettleEvery <= 0 {
		o.SettleEvery = 200 * time.Millisecond
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &Watcher{o: o}
}

// maxRefusedLogged bounds the endpoints a watcher remembers having logged
// as refused (each is logged once per run, not on every answer); past it
// the memory starts over.
const maxRefusedLogged = 1024

// screen drops the endpoints the policy refuses from a, counting and
// logging them (each the first time this run sees it). An answer whose
// every endpoint is refused becomes an error: like an empty one, it keeps
// the last good set rather than draining it.
func (w *Watcher) screen(a Answer, policy *AddressPolicy, logged map[string]bool) Answer {
	o := w.o
	if policy == nil || a.Err != nil || len(a.Endpoints) == 0 {
		return a
	}
	kept := a.Endpoints[:0:0]
	for _, u := range a.Endpoints {
		reason := policy.Check(u)
		if reason == "" {
			kept = append(kept, u)
			continue
		}
		o.Metrics.Refused.WithLabelValues(o.Source, reason).Inc()
		if logged[u] {
			continue
		}
		if len(logged) >= maxRefusedLogged {
			clear(logged)
		}
		logged[u] = true
		o.Logger.Warn("discovery: endpoint refused; it is not added as a worker", "source", o.Source, "endpoint", u,
			"reason", reason, "hint", refusalHint(reason))
	}
	if len(kept) == 0 {
		return Answer{Err: fmt.Errorf("all %d endpoints refused (discovery.allowed_networks; see the log)", len(a.Endpoints))}
	}
	a.Endpoints = kept
	return a
}

func refusalHint(reason string) string {
	switch reason {
	case RefusedLoopback, RefusedLinkLocal, RefusedNotAllowed:
		return "if it really is a worker, list its network in discovery.allowed_networks"
	case RefusedOwn:
		return "it is one of this process's own listeners"
	case RefusedInvalid:
		return "not an IP address with a port"
	}
	return "never a worker address"
}

// runPolicy is the policy for one run, with this host's addresses read
// now (for listeners bound to every interface).
func (w *Watcher) runPolicy() *AddressPolicy {
	if w.o.Policy == nil {
		return nil
	}
	p := *w.o.Policy
	for _, l := range p.Own {
		if !l.Addr().IsUnspecified() {
			continue
		}
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			w.o.Logger.Warn("discovery: cannot list this host's addresses; endpoints on them are refused only when loopback", "error", err.Error())
			break
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok {
					p.Local = append(p.Local, ip.Unmap())
				}
			}
		}
		break
	}
	return &p
}

// Run resolves, reconciles and applies until ctx ends. It starts from the
// source's workers already in the pool, so a new control-plane leader
// continues from the replicated set. On exit it undrains what it drained:
// draining is the running watcher's soft state, and the next watcher (a new
// leader) recounts absences from scratch.
func (w *Watcher) Run(ctx context.Context) {
	o := w.o
	var known []string
	for u, src := range o.Sink.Pool() {
		if src == o.Source {
			known = append(known, u)
		}
	}
	r := NewReconciler(o.Rules, known)
	policy, logged := w.runPolicy(), map[string]bool{}
	defer func() {
		for _, u := range r.Draining() {
			o.Sink.SetDraining(u, false)
		}
	}()
	if s, ok := o.Resolver.(Starter); ok {
		defer s.Start(ctx)()
	}
	var notify <-chan struct{}
	if n, ok := o.Resolver.(Notifier); ok {
		notify = n.Notify()
	}
	stale := o.Metrics.Stale.WithLabelValues(o.Source)
	errs := o.Metrics.Errors.WithLabelValues(o.Source)
	timer := time.NewTimer(0)
	defer timer.Stop()
	// nextAt is when timer fires; last is when the last answer came.
	nextAt, last := time.Now(), time.Time{}
	settle := time.NewTicker(o.SettleEvery)
	defer settle.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-settle.C:
			w.settle(ctx, r)
		case <-notify:
			// Resolve soon, but never sooner than MinInterval after the
			// last answer: damping counts answers, and a burst of events
			// must not count as several absences.
			now := time.Now()
			at := last.Add(o.Rules.MinInterval)
			if at.Before(now) {
				at = now
			}
			if at.Before(nextAt) {
				timer.Reset(at.Sub(now))
				nextAt = at
			}
		case <-timer.C:
			a := o.Resolver.Resolve(ctx)
			last = time.Now()
			if ctx.Err() != nil {
				return
			}
			a = w.screen(a, policy, logged)
			ch := r.Observe(a, o.Now())
			if ch.Stale {
				errs.Inc()
				stale.Set(1)
				msg := "empty answer"
				if a.Err != nil {
					msg = a.Err.Error()
				}
				o.Logger.Warn("discovery: unusable answer; keeping the last good worker set", "source", o.Source,
					"error", msg, "workers", len(r.Active()), "retry_in", ch.Next.String())
			} else {
				stale.Set(0)
				w.roles = a.Roles
			}
			pool := o.Sink.Pool()
			for _, u := range ch.Drain {
				if src, ok := pool[u]; ok && src != o.Source {
					r.Removed(u) // configured by another source: never ours to drain
					continue
				}
				o.Sink.SetDraining(u, true)
				o.Metrics.Changes.WithLabelValues(o.Source, "drain").Inc()
				o.Logger.Info("discovery: worker left its source; draining", "source", o.Source, "worker", u)
			}
			for _, u := range ch.Undrain {
				o.Sink.SetDraining(u, false)
				o.Metrics.Changes.WithLabelValues(o.Source, "undrain").Inc()
				o.Logger.Info("discovery: draining worker came back", "source", o.Source, "worker", u)
			}
			w.ensure(ctx, r)
			w.settle(ctx, r)
			next := ch.Next
			if notify != nil && r.Unsettled() {
				next = min(next, o.Rules.MinInterval)
			}
			timer.Reset(next)
			nextAt = time.Now().Add(next)
		}
	}
}

// ensure adds every active member the pool lacks. Comparing with the pool
// (not only applying the last answer's additions) retries failed adds.
func (w *Watcher) ensure(ctx context.Context, r *Reconciler) {
	o := w.o
	pool := o.Sink.Pool()
	for _, u := range r.Active() {
		src, ok := pool[u]
		if ok {
			if src != o.Source {
				o.Logger.Debug("discovery: endpoint already configured by another source; left alone", "source", o.Source, "worker", u, "owner", src)
			}
			continue
		}
		if err := o.Sink.Add(ctx, u, w.roles[u]); err != nil {
			o.Logger.Warn("discovery: add worker failed; retrying on the next answer", "source", o.Source, "worker", u, "error", err.Error())
			continue
		}
		o.Metrics.Changes.WithLabelValues(o.Source, "add").Inc()
		o.Logger.Info("discovery: worker added", "source", o.Source, "worker", u, "role", config.RoleShown(w.roles[u]))
	}
}

// settle removes draining members that are idle or past the drain timeout.
func (w *Watcher) settle(ctx context.Context, r *Reconciler) {
	o := w.o
	for _, u := range r.Due(o.Now(), o.Sink.Load) {
		if src, ok := o.Sink.Pool()[u]; ok && src != o.Source {
			r.Removed(u) // someone else owns it now: not ours to remove
			continue
		}
		load := o.Sink.Load(u)
		if err := o.Sink.Remove(ctx, u); err != nil {
			o.Logger.Warn("discovery: remove worker failed; retrying", "source", o.Source, "worker", u, "error", err.Error())
			continue
		}
		r.Removed(u)
		o.Metrics.Changes.WithLabelValues(o.Source, "remove").Inc()
		o.Logger.Info("discovery: drained worker removed", "source", o.Source, "worker", u, "in_flight_left", load)
	}
}
