package remote

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cartrouter/cart/controlplane/affinity"
	"github.com/cartrouter/cart/controlplane/cpclient"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/flow"
	"github.com/cartrouter/cart/controlplane/models"
	"github.com/cartrouter/cart/dataplane/apierr"
	"github.com/cartrouter/cart/dataplane/router"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
	"github.com/cartrouter/cart/internal/every"
)

// ReasonFallbackLocal marks decisions made locally without the control
// plane (router.Decision carries reasons as plain strings).
const ReasonFallbackLocal = string(engine.ReasonFallbackLocal)

// Options configure the remote router.
type Options struct {
	ID            string   // this data plane's id
	ControlPlanes []string // API URLs of control-plane nodes (any of them)
	RouteTimeout  time.Duration
	SyncInterval  time.Duration // worker set + load reconciliation
	FlushInterval time.Duration // completions not carried by a Route call go in a batch within two of these
	Token         string
	HTTPClient    *http.Client
	// BootWorkers are used until the first successful sync (a data plane
	// may start while the control plane is unreachable).
	BootWorkers []router.WorkerStatus
	BlockChars  int
	Logger      *slog.Logger
	// OnFallback is told the cause of each local fallback (for metrics).
	OnFallback func(cause string)
	// OnHealthy is told of each worker the control plane reports healthy
	// again after reporting it unhealthy (it may reset a circuit breaker).
	OnHealthy func(url string)
	Seed      uint64
	// Models, when set, receives each worker's model list from every
	// sync (the leader's prober learns them), for the proxy's model filter.
	Models *models.Registry
	// Shadow keeps fallback decisions cache-aware (see shadow.go).
	Shadow ShadowOptions
	// PlacementFeed asks the leader, in the Route stream's hello, for every
	// placement it makes, which the shadow then records instead of this
	// data plane's answers (controlplane/service/placementfeed.go). Needs
	// RouteStream and a shadow.
	PlacementFeed bool
	// RouteBreakerFailures and RouteBreakerCooloff configure the
	// control-plane breaker (see cpbreaker.go); 0 failures disables it.
	RouteBreakerFailures int
	RouteBreakerCooloff  time.Duration
	// Now is the breaker's clock (tests inject one); nil means time.Now.
	Now func() time.Time
	// Interceptors wrap every control-plane call (tracing); nil: none.
	Interceptors []connect.Interceptor
	// MaxAnswerBytes bounds each message read from a control-plane node;
	// 0 means cpclient.MaxAnswerBytes.
	MaxAnswerBytes int
	// RouteStream carries Route, Complete and Sync on one long-lived
	// stream to the leader while one is live (see stream.go); the unary
	// calls are the fallback. RouteStreamMaxInFlight bounds the calls in
	// flight on it (0: DefaultStreamInFlight).
	RouteStream            bool
	RouteStreamMaxInFlight int
	// Flow is the data plane's side of flow control (flow.go).
	Flow FlowOptions
}

// Router implements router.Router against the control plane.
type Router struct {
	o   Options
	log *slog.Logger

	mu        sync.Mutex
	workers   []router.WorkerStatus // last known set, Load = our in-flight
	version   uint64
	local     map[string]int
	target    int // index into targets of the node we talk to
	targets   []string
	leaderURL string // learned from Sync and Route answers; preferred target
	// lastLeader is the last leader URL learned (rotate does not clear
	// it): a different one resets the control-plane breaker.
	lastLeader string
	// lat is this sync window's Route latency, reported in Sync for the
	// leader's slow-leader handover.
	lat routeLatency
	// pending are completions to report (they ride with Route calls to a
	// leader that settles them, or go in the flush); abandons are reports
	// of abandoned Route calls, which only the flush sends, so that they
	// do not overtake the call they name.
	pending, abandons reports
	fallbacks         uint64 // since the last successful sync
	synced            bool
	rng               *rand.Rand

	clients  *cpclient.ByURL[cartv1connect.RouterServiceClient]
	flushNow chan struct{}
	// lastRouteID names each Route call, so one given up on can be
	// reported abandoned (it has no ticket to name it by). With open, the
	// calls without an answer yet, and the reports taken from the queues
	// and not yet acknowledged (sentTickets, sentAbandons), it is what a
	// Sync's fence says its counts could not include; doneSeq counts the
	// finished ticketed requests. All under mu, with local, so that a Sync
	// sees each call in exactly one place.
	lastRouteID  uint64
	firstRouteID uint64 // names this process to the leader
	syncSeq      uint64
	flushFailed  bool // the last flush's Complete call failed: no early flush until one works
	// queueSeen is when (unix ns) an answer last said the leader's queue
	// held requests: for queueSeenFor after it, a completion is flushed
	// at once (each frees room a waiting request needs; batching it
	// would leave that room idle for up to two FlushIntervals).
	queueSeen    atomic.Int64
	open         map[uint64]struct{}
	sentTickets  map[uint64]int // ticket → reports in flight carrying it
	sentAbandons map[uint64]int // route id → abandon reports in flight
	doneSeq      uint64

	shadow     *shadow    // nil when disabled
	cpb        *cpBreaker // nil when disabled
	timeouts   timeoutRun // when to drop the connections to the control plane (redial.go)
	redials    *prometheus.CounterVec
	streams    *streamer  // nil when Options.RouteStream is off
	authWarned every.Gate // the rejected-token warning
	// cpBlockChars is the control plane's cache.block_chars when its last
	// Sync named one different from ours (0: they agree, or it did not
	// say): our hashes would never match its index and would fill it with
	// entries no other data plane can match, so Route calls carry none
	// (the leader routes by load, sessions and stored responses), and the
	// placement feed, hashed at its size, is not recorded.
	cpBlockChars atomic.Int64
	// abandonedIDs are this data plane's Route calls it gave up on (most
	// recent maxAbandoned): the leader withdraws those placements, so the
	// placement feed's copies of them are not recorded.
	abandonedMu  sync.Mutex
	abandonedIDs map[uint64]struct{}
	abandonedLog []uint64

	// lq is the local flow-control queue used while no leader answers,
	// and leaderBack is closed (and replaced) when one answers again, to
	// hand its requests over (flow.go). Both under mu; nil with flow off.
	lq         *flow.Queue[*localWaiter]
	leaderBack chan struct{}
}

// New builds the router. Call Run to start syncing.
func New(o Options) *Router {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.HTTPClient == nil {
		o.HTTPClient = http.DefaultClient
	}
	if o.FlushInterval <= 0 {
		o.FlushInterval = 10 * time.Millisecond
	}
	if o.MaxAnswerBytes <= 0 {
		o.MaxAnswerBytes = cpclient.MaxAnswerBytes
	}
	r := &Router{
		o: o, log: o.Logger,
		workers:  append([]router.WorkerStatus(nil), o.BootWorkers...),
		local:    map[string]int{},
		targets:  append([]string(nil), o.ControlPlanes...),
		rng:      rand.New(rand.NewPCG(o.Seed, uint64(time.Now().UnixNano()))),
		flushNow: make(chan struct{}, 1),
		shadow:   newShadow(o.Shadow),
		cpb:      newCPBreaker(o.RouteBreakerFailures, o.RouteBreakerCooloff, o.Now),
	}
	r.clients = cpclient.NewByURL(r.newClient)
	if o.Flow.On {
		if r.o.Flow.QueueTimeout <= 0 {
			r.o.Flow.QueueTimeout = 30 * time.Second
		}
		if r.o.Flow.RetryAfter <= 0 {
			r.o.Flow.RetryAfter = time.Second
		}
		r.lq = flow.New[*localWaiter](o.Flow.Limits)
		r.leaderBack = make(chan struct{})
	}
	r.timeouts.after = redialAfter
	if o.RouteBreakerFailures > 0 {
		r.timeouts.after = o.RouteBreakerFailures
	}
	r.redials = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_cp_redials_total",
		Help: "Times this data plane closed its connections to a control-plane node to dial afresh, by why: route_timeouts (Route calls kept timing out on them) or stream_hello (the Route stream's hello went unanswered)."}, []string{"why"})
	if o.RouteStream {
		r.streams = newStreamer(r, o.RouteStreamMaxInFlight)
	}
	// A random start keeps a restarted data plane (same id) from naming
	// its calls like its predecessor's still-unsettled ones.
	r.lastRouteID = r.rng.Uint64() >> 1
	r.firstRouteID = r.lastRouteID + 1
	r.open = map[uint64]struct{}{}
	r.sentTickets, r.sentAbandons = map[uint64]int{}, map[uint64]int{}
	if len(r.targets) > 0 {
		// Spread data planes across control-plane nodes for their first
		// contact; Sync then points each at the leader.
		r.target = r.rng.IntN(len(r.targets))
	}
	return r
}

func (r *Router) client(url string) cartv1connect.RouterServiceClient { return r.clients.Get(url) }

// newClient is the client to the control-plane node at url.
func (r *Router) newClient(url string) cartv1connect.RouterServiceClient {
	// Route requests are a few hundred bytes: no compression, and no
	// gzip for the small answers either (see service.CompressMinBytes).
	opts := []connect.ClientOption{connect.WithGRPC(), connect.WithCompressMinBytes(4096), connect.WithReadMaxBytes(r.o.MaxAnswerBytes)}
	if r.o.Token != "" {
		opts = append(opts, connect.WithInterceptors(cpclient.Bearer(r.o.Token)))
	}
	opts = append(opts, connect.WithInterceptors(r.o.Interceptors...))
	return cartv1connect.NewRouterServiceClient(r.o.HTTPClient, url, opts...)
}

// current returns the node to call: the leader when known.
func (r *Router) current() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.leaderURL != "" {
		return r.leaderURL
	}
	if len(r.targets) == 0 {
		return ""
	}
	return r.targets[r.target%len(r.targets)]
}

// rotate moves to the next control-plane node after a failure and forgets
// the leader, which may be the node that failed.
func (r *Router) rotate(failed string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.leaderURL == failed {
		r.leaderURL = ""
	}
	if len(r.targets) > 0 && r.targets[r.target%len(r.targets)] == failed {
		r.target = (r.target + 1) % len(r.targets)
	}
	r.streams.poke()
}

// follow makes url, named by a control-plane answer as the leader, the
// target of the next calls. A new leader gets a fresh control-plane
// breaker: the breaker judged the old one, and keeping it open would send
// requests to local fallback for up to a cool-off for nothing.
func (r *Router) follow(url string) {
	if url == "" {
		return
	}
	r.mu.Lock()
	changed := url != r.lastLeader
	moved := url != r.leaderURL
	r.leaderURL, r.lastLeader = url, url
	r.mu.Unlock()
	if moved {
		r.streams.poke()
	}
	if changed {
		r.cpb.reset()
	}
}

// notLeaderURL returns the leader URL named by a control-plane node's
// NotLeader error detail, or "".
func notLeaderURL(err error) string {
	nl, _ := cpclient.NotLeaderOf(err)
	return nl.GetLeaderUrl()
}

// Decide implements router.Router. With flow control on, a request that
// finds the pool saturated waits in the leader's queue (or, while no
// leader answers, in this data plane's), and is asked again of the next
// leader if its queued call's stream breaks (flow.go).
func (r *Router) Decide(ctx context.Context, req *router.Request) (router.Decision, error) {
	start := time.Now()
	if r.flowOn() && req.Admission.Arrival.IsZero() {
		req.Admission.Arrival = start
	}
	for round := 1; ; round++ {
		d, again, err := r.decideOnce(ctx, req, start)
		if !again {
			return d, err
		}
		if round >= maxRouteRounds || !time.Now().Before(r.queueDeadline(req)) {
			return router.Decision{}, &router.RefusedError{Reason: router.RefusedTimeout, RetryAfter: r.o.Flow.RetryAfter,
				Err: fmt.Errorf("no worker took the request before its queue deadline (the control plane changed while it waited): %w", err)}
		}
	}
}

// decideOnce asks the control plane once (or decides locally). again: the
// request waited in a queue that went away (the leader's stream broke, or
// a leader answers again while it waited locally) and is to be asked again.
func (r *Router) decideOnce(ctx context.Context, req *router.Request, start time.Time) (_ router.Decision, again bool, _ error) {
	target := r.current()
	var cause string
	allowed, call := true, cpCall{}
	hashes := req.Hashes
	if r.cpBlockChars.Load() != 0 {
		// The leader still balances and pins (sessions, stored
		// responses); our hashes would never match its index.
		hashes = nil
	}
	if target != "" {
		allowed, call = r.cpb.allow()
	}
	round := r.timeouts.start()
	if target == "" {
		cause = "no_control_plane"
	} else if !allowed {
		// The control plane keeps failing to answer in time: waiting out
		// the route timeout again would only add it to this request.
		cause = CauseCPBreaker
	} else {
		// One look at the stream for both: riders must go only in the
		// call of the stream whose leader said it settles them, never in
		// a unary call to a node that may not.
		st := r.streams.live(target)
		routeID, riders := r.openCall(!req.DryRun, st)
		rctx, cancel := context.WithTimeout(ctx, r.o.RouteTimeout)
		queue := st != nil && st.queues
		var wait context.Context
		waitCancel := func() {}
		if queue {
			// Once queued, the call waits until the queue deadline, plus a
			// second for the leader's own 429 to arrive first.
			wait, waitCancel = context.WithDeadline(ctx, r.queueDeadline(req).Add(time.Second))
		}
		m, queued, err := r.askLeader(rctx, wait, target, st, &cartv1.RouteRequest{
			Endpoint: req.Endpoint, Model: req.Model, BlockHashes: hashes, KeyLength: uint32(req.KeyLen),
			DataplaneId: r.o.ID, ExcludeWorkers: req.Exclude, AvoidWorkers: req.Avoid, DryRun: req.DryRun, RequestId: req.ID, SessionKey: req.Session,
			RouteId: routeID, ResponseIdHash: responseHash(req.ResponseID), TenantHash: tenantHash(req), Completions: riders,
			Admission: r.admission(req, queue), Disaggregation: cpclient.DisaggToWire(req.Disagg),
		})
		cancel()
		waitCancel()
		// The leader may have decided (and placed) before the answer was
		// lost or came too late; this data plane will never use it, so
		// say so rather than leave it for the leader to age out.
		abandoned := err != nil && routeID != 0 && !answeredByLeader(err)
		worker, prefill := "", ""
		if err == nil && !req.DryRun {
			worker, prefill = m.GetWorker(), m.GetPrefill().GetWorker()
		}
		r.closeCall(routeID, riders, err != nil, abandoned, worker, prefill)
		if abandoned {
			r.rememberAbandoned(routeID)
		}
		outcome := cpOutcome(ctx, err)
		if queued && outcome == cpFailed {
			// It waited in the queue as long as the queue allows: the
			// leader answered (queued), it is not a slow leader.
			outcome = cpAnswered
		}
		if r.cpb.done(call, outcome) {
			// The probe of an open breaker was answered: the leader is
			// back, and the stream should follow now, not after a
			// backoff grown while it was away.
			r.streams.answered()
		}
		if r.timeouts.done(target, round, outcome) {
			r.dropConns(target, "route_timeouts")
		}
		if (outcome == cpAnswered || outcome == cpFailed) && !queued {
			// A queued call's time is the queue's, not the leader's: it
			// must not look like a slow leader (slow-leader handover).
			r.lat.add(target, time.Since(start))
		}
		if err == nil {
			if queued || m.GetQueueDepth() > 0 {
				r.queueSeen.Store(time.Now().UnixNano())
			}
			if r.flowOn() {
				r.mu.Lock()
				r.leaderIsBackLocked()
				r.mu.Unlock()
			}
			// A follower forwarded this call: go to the leader directly
			// from the next one on, not after the next sync.
			r.follow(m.GetLeaderUrl())
			source := m.GetWorkerSource()
			if source == "" {
				// A leader that predates worker_source: as last synced.
				r.mu.Lock()
				source = r.sourceOf(m.GetWorker())
				r.mu.Unlock()
			}
			d := router.Decision{
				Worker: m.GetWorker(), Reason: m.GetReason(), MatchedChars: int(m.GetMatchedChars()),
				MatchedRatio: m.GetMatchedRatio(), Candidate: m.GetCandidate(), ChosenChars: int(m.GetChosenChars()),
				Latency: time.Since(start), FromLeader: m.GetFromLeader(),
				Ticket: router.Ticket{ID: m.GetTicket(), Worker: m.GetWorker()}, Pinned: m.GetPinned(),
				AvoidIgnored: m.GetAvoidIgnored(), Waited: time.Duration(m.GetWaitedMicros()) * time.Microsecond, Source: source,
				Whole: m.GetWhole(), Prefill: prefillLeg(m.GetPrefill(), time.Since(start), m.GetFromLeader()),
			}
			if d.Prefill != nil {
				d.Prefill.Source = m.GetPrefill().GetWorkerSource()
				if d.Prefill.Source == "" {
					r.mu.Lock()
					d.Prefill.Source = r.sourceOf(d.Prefill.Worker)
					r.mu.Unlock()
				}
			}
			if !req.DryRun && !r.streams.fed() {
				// Else the feed brings it, in the leader's order.
				r.shadow.record(req.Hashes, placedOn(d))
			}
			return d, false, nil
		}
		if re, ok := refused(err); ok {
			return router.Decision{}, false, re
		}
		if queued && ctx.Err() == nil {
			if !time.Now().Before(r.queueDeadline(req)) {
				return router.Decision{}, false, &router.RefusedError{Reason: router.RefusedTimeout, RetryAfter: r.o.Flow.RetryAfter,
					Err: errors.New("no worker had room within the queue timeout")}
			}
			// Queued at a leader whose stream broke (it stepped down, or
			// the path to it failed): ask again, keeping the arrival.
			r.logRPCError("queued route call lost with its stream; asking again", target, err)
			if url := notLeaderURL(err); url != "" && url != target {
				r.follow(url)
			}
			return router.Decision{}, true, err
		}
		if req.ResponseID != "" && connect.CodeOf(err) == connect.CodeFailedPrecondition {
			// The leader knows the response, and that its worker is gone.
			return router.Decision{}, false, fmt.Errorf("%w: %v", router.ErrResponseGone, err)
		}
		if req.ResponseID != "" && cpclient.IsResponseNotFound(err) {
			// The leader knows the response: another tenant's.
			return router.Decision{}, false, router.ErrResponseNotFound
		}
		if ctx.Err() != nil {
			return router.Decision{}, false, ctx.Err() // the client left; nothing to route
		}
		if connect.CodeOf(err) == connect.CodeResourceExhausted {
			if st == nil && r.flowOn() && r.streams != nil && !req.DryRun && cpclient.IsPoolSaturated(err) {
				// A unary call while the stream is down (reconnecting
				// after a leader change) could not wait in the queue:
				// wait for the stream, then ask again, rather than turn a
				// request that should wait into a 503. A live stream to a
				// leader that does not queue (flow control off there, or
				// an older release) will not start to: 503 at once.
				if r.waitStream(ctx, r.queueDeadline(req)) {
					return router.Decision{}, true, err
				}
			}
			// The control plane answered: no worker can take this.
			return router.Decision{}, false, &unavailable{err}
		}
		if connect.CodeOf(err) == connect.CodeNotFound {
			// The leader knows better than this data plane's last sync (an
			// adapter was just unloaded): no worker serves the model.
			return router.Decision{}, false, apierr.New(http.StatusNotFound, apierr.TypeInvalidRequest, "model_not_found",
				"The model `%s` does not exist: no worker of this pool serves it.", req.Model)
		}
		cause = causeOf(err)
		if url := notLeaderURL(err); url != "" && url != target {
			r.follow(url) // the node named the leader it could not reach for us
		} else if cause != "timeout" {
			// A slow answer is not a dead node: keep talking to the leader
			// (rotating to a follower would add a forwarding hop and make
			// the next deadline harder to meet); errors rotate.
			r.rotate(target)
		}
		r.logRPCError("route via control plane failed; routing locally", target, err)
	}
	d, err := r.fallback(ctx, req)
	if errors.Is(err, errHandOver) {
		return router.Decision{}, true, err
	}
	if err != nil {
		return d, false, err
	}
	if !req.DryRun {
		r.shadow.record(req.Hashes, placedOn(d)) // outside r.mu: an insert walks the whole path
	}
	d.Latency = time.Since(start)
	if r.o.OnFallback != nil {
		r.o.OnFallback(cause)
	}
	return d, false, nil
}

// dropConns closes this data plane's connections to the control-plane
// node at target, calls in flight on them included, so that the next call
// dials afresh (cpclient.Transport.DropConns). A client without that
// (tests, a caller's own) is left alone.
func (r *Router) dropConns(target, why string) {
	d, ok := r.o.HTTPClient.Transport.(interface{ DropConns(string) int })
	if !ok {
		return
	}
	n := d.DropConns(target)
	r.redials.WithLabelValues(why).Inc()
	r.log.Info("dropped the connections to a control-plane node that did not answer; the next call dials afresh",
		"control_plane", target, "connections", n, "why", why)
}

// cpOutcome classifies a Route call for the control-plane breaker.
func cpOutcome(ctx context.Context, err error) int {
	switch {
	case err == nil:
		return cpAnswered
	case ctx.Err() != nil:
		return cpUnknown // the client left: says nothing of the control plane
	case errors.Is(err, errStreamBroken):
		// Every call in flight fails together when a stream breaks, also
		// when the leader merely stepped down: one event, not a run of
		// failures. Calls to a leader that is really gone fail on their own.
		return cpUnknown
	}
	switch connect.CodeOf(err) {
	case connect.CodeResourceExhausted, connect.CodeNotFound, connect.CodeFailedPrecondition:
		return cpAnswered
	}
	switch causeOf(err) {
	case "timeout":
		return cpFailed
	case "unavailable":
		return cpRefused
	}
	return cpUnknown
}

func causeOf(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded), connect.CodeOf(err) == connect.CodeDeadlineExceeded:
		return "timeout"
	case connect.CodeOf(err) == connect.CodeUnavailable:
		return "unavailable"
	case connect.CodeOf(err) == connect.CodeUnauthenticated, connect.CodeOf(err) == connect.CodePermissionDenied:
		return "auth"
	default:
		return "error"
	}
}

type unavailable struct{ err error }

func (u *unavailable) Error() string {
	var ce *connect.Error
	if errors.As(u.err, &ce) {
		return ce.Message()
	}
	return u.err.Error()
}

func (u *unavailable) Unwrap() []error { return []error{u.err, router.ErrUnavailable} }

// fallback picks the least-loaded usable worker by this data plane's own
// in-flight counts, breaking ties at random so that data planes falling
// back together do not stampede onto one replica; or, when the shadow
// index remembers a good enough prefix match on a worker that is not
// overloaded by the control plane's balance rule, that worker. Avoided
// workers are kept out as the leader would: unless nobody else is usable.
// With flow control on, a request that finds every worker it may use at
// its limit waits in the local queue (flow.go).
func (r *Router) fallback(ctx context.Context, req *router.Request) (router.Decision, error) {
	r.mu.Lock()
	d, full, err := r.pickLocked(req)
	if err != nil && full && r.flowOn() && !req.DryRun {
		return r.waitLocal(ctx, req) // unlocks
	}
	r.mu.Unlock()
	return d, err
}

// pickLocked is fallback's choice (a pair when the request may be split,
// pd.go); full reports that workers were usable but every one at its
// limit. r.mu held.
func (r *Router) pickLocked(req *router.Request) (_ router.Decision, full bool, _ error) {
	d, full, err := r.choosePairLocked(req)
	if err != nil || req.DryRun {
		return d, full, err
	}
	r.local[d.Worker]++
	if d.Prefill != nil {
		r.local[d.Prefill.Worker]++
	}
	r.fallbacks++
	return d, false, nil
}

// chooseLocked picks, without taking it, the worker of roles that
// fallback would: the shadow's good-enough match unless overloaded, else
// the least loaded. r.mu held.
func (r *Router) chooseLocked(req *router.Request, roles engine.RoleMask) (_ router.Decision, full bool, _ error) {
	best, bestLoad, usable, known, atLimit := r.leastLoaded(req.Exclude, req.Avoid, roles)
	avoidIgnored := false
	if best == "" && len(req.Avoid) > 0 {
		best, bestLoad, usable, _, atLimit = r.leastLoaded(req.Exclude, nil, roles)
		avoidIgnored = best != ""
	}
	if best == "" {
		msg := "no usable worker known to this data plane (control plane unreachable)"
		if known == 0 {
			msg = "no workers configured"
		}
		return router.Decision{}, atLimit > 0, &unavailable{connect.NewError(connect.CodeResourceExhausted, errors.New(msg))}
	}
	d := router.Decision{Reason: ReasonFallbackLocal, AvoidIgnored: avoidIgnored}
	if c, chars := r.shadow.pick(req.Hashes, req.KeyLen, r.o.BlockChars, usable, best, bestLoad); c != "" {
		best, d.Candidate, d.MatchedChars, d.ChosenChars = c, c, chars, chars
		d.MatchedRatio = float64(chars) / float64(req.KeyLen)
	}
	d.Worker, d.Ticket = best, router.Ticket{Worker: best} // no control-plane ticket
	d.Source = r.sourceOf(best)
	return d, false, nil
}

// sourceOf is the source of the worker at url in the last synced set,
// router.SourceUnknown when it is not there. r.mu held.
func (r *Router) sourceOf(url string) string {
	for _, w := range r.workers {
		if w.URL == url {
			return w.Source
		}
	}
	return router.SourceUnknown
}

// leastLoaded returns the least-loaded usable worker of roles outside
// exclude and avoid ("" when none), its effective load, the usable workers
// for the shadow (nil when it is off), how many workers are known and how
// many were left out only for being at their limit. r.mu held.
func (r *Router) leastLoaded(exclude, avoid []string, roles engine.RoleMask) (best string, bestLoad int, usable []usableWorker, known, atLimit int) {
	ties := 0
	for _, w := range r.workers {
		known++
		if !w.Healthy || w.Draining || !roles.Has(w.Role) || contains(exclude, w.URL) || contains(avoid, w.URL) {
			continue
		}
		load := r.local[w.URL]
		if lim := limitOf(w); lim > 0 && load >= lim {
			atLimit++
			continue
		}
		eff := load + w.LoadPenalty
		if r.shadow != nil {
			usable = append(usable, usableWorker{w.URL, eff})
		}
		switch {
		case best == "" || eff < bestLoad:
			best, bestLoad, ties = w.URL, eff, 1
		case eff == bestLoad:
			ties++
			if r.rng.IntN(ties) == 0 {
				best = w.URL
			}
		}
	}
	return best, bestLoad, usable, known, atLimit
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func responseHash(id string) uint64 {
	if id == "" {
		return 0
	}
	return affinity.HashID(id)
}

// tenantHash is the RouteRequest.tenant_hash of req: only a request naming
// a stored response needs it.
func tenantHash(req *router.Request) uint64 {
	if req.ResponseID == "" {
		return 0
	}
	return affinity.HashTenant(req.Tenant)
}

// LearnResponse implements router.ResponseLearner: it tells the leader at
// once, not with the next completion batch, because the client holds the
// id as soon as this returns and may continue the conversation through
// another data plane. A failure is logged and otherwise ignored: this data
// plane's own table still pins the id, and another data plane routes an
// id it cannot resolve by prefix.
func (r *Router) LearnResponse(ctx context.Context, id, worker, tenant string) {
	target := r.current()
	if target == "" {
		return
	}
	timeout := r.o.RouteTimeout
	if timeout <= 0 {
		timeout = time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := r.completeCall(ctx, target, &cartv1.CompleteRequest{
		DataplaneId: r.o.ID, ResponseOrigins: []*cartv1.ResponseOrigin{{IdHash: affinity.HashID(id), Worker: worker, TenantHash: affinity.HashTenant(tenant)}},
	})
	if err != nil {
		r.logRPCError("report response origin failed", target, err)
	}
}

// openCall names a Route call (when it is not a dry run) and takes the
// completions that ride with it, in one hold of mu: from here until
// closeCall a Sync lists the call as open and its riders as unsettled.
// Riders are the oldest queued completions, up to maxRiders: at thousands
// of routes a second nearly every one then goes to the leader within a
// route's interval, instead of in a flush's Complete call, a stream
// message each way. Only a live stream whose leader said it settles
// riders gets them: an older leader would ignore them.
func (r *Router) openCall(named bool, st *routeStream) (routeID uint64, riders []*cartv1.Completion) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if named {
		r.lastRouteID++
		routeID = r.lastRouteID
		r.open[routeID] = struct{}{}
	}
	if st != nil && st.riders {
		riders = r.pending.take(maxRiders)
		r.sending(riders, 1)
	}
	return routeID, riders
}

// closeCall ends a Route call in one hold of mu, so that a Sync sees it
// either open or done: a failed call's riders go back to the queue (they
// may not have been settled; settling twice is a no-op on the leader), an
// abandoned call's report is queued, and an answer's worker is counted in
// flight.
func (r *Router) closeCall(routeID uint64, riders []*cartv1.Completion, failed, abandoned bool, worker, prefill string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.open, routeID)
	r.sending(riders, -1)
	if failed && len(riders) > 0 {
		r.pending.putBack(riders)
	}
	if abandoned {
		r.abandons.add(&cartv1.Completion{Abandoned: true, RouteId: routeID, PromptTokens: -1, CachedTokens: -1})
	}
	if worker != "" {
		r.local[worker]++
	}
	if prefill != "" {
		r.local[prefill]++ // a split answer's other leg, held by its own ticket
	}
}

// sending counts reports into (+1) or out of (-1) a call in flight. mu
// held.
func (r *Router) sending(cs []*cartv1.Completion, d int) {
	for _, c := range cs {
		m, k := r.sentTickets, c.GetTicket()
		if c.GetAbandoned() {
			m, k = r.sentAbandons, c.GetRouteId()
		}
		if m[k] += d; m[k] <= 0 {
			delete(m, k)
		}
	}
}

// rememberAbandoned keeps routeID out of the placement feed's records.
func (r *Router) rememberAbandoned(routeID uint64) {
	r.abandonedMu.Lock()
	defer r.abandonedMu.Unlock()
	if r.abandonedIDs == nil {
		r.abandonedIDs = make(map[uint64]struct{}, maxAbandoned)
	}
	if len(r.abandonedLog) >= maxAbandoned {
		delete(r.abandonedIDs, r.abandonedLog[0])
		r.abandonedLog = r.abandonedLog[1:]
	}
	r.abandonedIDs[routeID] = struct{}{}
	r.abandonedLog = append(r.abandonedLog, routeID)
}

// maxAbandoned bounds the abandoned Route calls remembered for the
// placement feed: more than a feed's few seconds of them.
const maxAbandoned = 4096

// applyFeed records the leader's placements in the shadow, except this
// data plane's abandoned calls (the leader withdraws them, and the local
// fallback's own choice for that request must stand) and everything while
// the block sizes differ (the leader's hashes would never match ours).
func (r *Router) applyFeed(p []*cartv1.RecentPlacement) {
	if r.cpBlockChars.Load() != 0 {
		return
	}
	kept := p[:0]
	r.abandonedMu.Lock()
	for _, pl := range p {
		if pl.GetRouteId() != 0 && pl.GetDataplaneId() == r.o.ID {
			if _, gone := r.abandonedIDs[pl.GetRouteId()]; gone {
				continue
			}
		}
		kept = append(kept, pl)
	}
	r.abandonedMu.Unlock()
	r.shadow.recordFed(kept)
}

// maxRiders is the most completions that ride with one Route call: the
// leader settles that many in the decision's own lock hold.
const maxRiders = 64

// answeredByLeader reports whether a failed Route call was refused with a
// code that says no decision was made: there is nothing to report
// abandoned.
func answeredByLeader(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeResourceExhausted, connect.CodeNotFound, connect.CodeFailedPrecondition, connect.CodeInvalidArgument:
		return true
	}
	return false
}

// Done implements router.Router.
func (r *Router) Done(d router.Decision, o router.Outcome) {
	t := d.Ticket
	if t.Worker == "" {
		return // a zero decision: nothing was routed
	}
	r.mu.Lock()
	r.releaseLocked(t.Worker)
	n := 0
	if t.ID != 0 {
		r.doneSeq++
		r.pending.add(&cartv1.Completion{
			Ticket: t.ID, Worker: t.Worker, Delivered: o.Delivered,
			PromptTokens: int32(o.PromptTokens), CachedTokens: int32(o.CachedTokens), DoneSeq: r.doneSeq,
			CompletionTokens: int32(o.CompletionTokens),
		})
		n = r.pending.len()
	}
	failing := r.flushFailed
	r.mu.Unlock()
	queueing := n > 0 && time.Since(time.Unix(0, r.queueSeen.Load())) < queueSeenFor
	if (n >= flushAllAt || queueing) && !failing {
		select {
		case r.flushNow <- struct{}{}:
		default:
		}
	}
}

// Workers implements router.Router: the last known set, with this data
// plane's own in-flight counts as Load.
func (r *Router) Workers() []router.WorkerStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]router.WorkerStatus, len(r.workers))
	for i, w := range r.workers {
		w.Load = r.local[w.URL]
		out[i] = w
	}
	return out
}

// Synced reports whether a sync with the control plane has succeeded.
func (r *Router) Synced() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.synced
}

// Run syncs and flushes completions, and keeps the Route stream open
// when it is on, until ctx ends.
func (r *Router) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); r.syncLoop(ctx) }()
	go func() { defer wg.Done(); r.flushLoop(ctx) }()
	if r.streams != nil {
		wg.Add(1)
		go func() { defer wg.Done(); r.streams.run(ctx) }()
	}
	wg.Wait()
}

func (r *Router) syncLoop(ctx context.Context) {
	t := time.NewTicker(r.o.SyncInterval)
	defer t.Stop()
	for {
		if err := r.SyncOnce(ctx); err != nil && ctx.Err() == nil {
			r.logRPCError("sync with control plane failed", r.current(), err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// SyncOnce reports this data plane's in-flight counts and refreshes the
// worker set from the leader.
func (r *Router) SyncOnce(ctx context.Context) error {
	target := r.current()
	if target == "" {
		return errors.New("no control plane configured")
	}
	req := r.syncRequest()
	sctx, cancel := context.WithTimeout(ctx, max(r.o.SyncInterval, time.Second))
	m, err := r.syncCall(sctx, target, req)
	cancel()
	if err != nil {
		r.rotate(target)
		return fmt.Errorf("sync with %s: %w", target, err)
	}
	if bc := int(m.GetBlockChars()); bc != 0 && r.o.BlockChars != 0 && bc != r.o.BlockChars {
		r.cpBlockChars.Store(int64(bc))
		r.log.Error("block size differs from the control plane's: routing without prefix matching until cache.block_chars matches", "local", r.o.BlockChars, "control_plane", bc)
	} else {
		r.cpBlockChars.Store(0)
	}
	ws := make([]router.WorkerStatus, len(m.GetWorkers()))
	for i, w := range m.GetWorkers() {
		role, _ := engine.ParseRole(w.GetRole()) // a role this build does not know reads as both
		ws[i] = router.WorkerStatus{URL: w.GetUrl(), MaxLoad: int(w.GetMaxLoad()), Concurrency: int(w.GetConcurrencyLimit()), LoadPenalty: int(w.GetLoadPenalty()), Healthy: w.GetHealthy(), Source: w.GetSource(), Draining: w.GetDraining(), Role: role,
			PredictedCachedTokens: w.GetPredictedCachedTokens(), ActualCachedTokens: w.GetActualCachedTokens(),
			CacheMisses: w.GetCacheMisses(), ModelCapacityBlocks: int(w.GetModelCapacityBlocks())}
		if k := w.GetKvCache(); k != nil {
			ws[i].KVEvents = &engine.KVState{On: true, OccupiedTokens: k.GetOccupiedTokens(), CapacityTokens: k.GetCapacityTokens()}
		}
	}
	r.mu.Lock()
	var recovered []string
	for _, old := range r.workers {
		if old.Healthy {
			continue
		}
		for _, w := range ws {
			if w.URL == old.URL && w.Healthy {
				recovered = append(recovered, w.URL)
			}
		}
	}
	r.workers, r.version, r.synced = ws, m.GetWorkersVersion(), true
	// A leader answers: hand the locally queued requests to its queue, and
	// a raised limit may let some go at once.
	r.leaderIsBackLocked()
	r.pumpLocked()
	if r.o.Models != nil {
		mws := make([]models.Worker, len(ws))
		for i, w := range ws {
			mws[i] = models.Worker{URL: w.URL}
		}
		r.o.Models.SetWorkers(mws)
		for _, w := range m.GetWorkers() {
			r.o.Models.SetLearnedIDs(w.GetUrl(), w.GetModels())
		}
	}
	r.fallbacks -= min(r.fallbacks, req.GetFallbacks())
	r.mu.Unlock()
	r.follow(m.GetLeaderUrl())
	if r.o.OnHealthy != nil {
		for _, u := range recovered {
			r.o.OnHealthy(u)
		}
	}
	return nil
}

// syncRequest takes a Sync's counts and their fence in one hold of mu:
// the fence is only right for counts taken at the same instant.
func (r *Router) syncRequest() *cartv1.SyncRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	req := &cartv1.SyncRequest{DataplaneId: r.o.ID, Fallbacks: r.fallbacks, RouteBreakerOpen: r.cpb.isOpen()}
	req.RouteTarget, req.RouteCalls, req.RouteP90Micros = r.lat.take()
	for w, n := range r.local {
		req.Loads = append(req.Loads, &cartv1.WorkerLoad{Worker: w, InFlight: uint32(n)})
	}
	r.syncSeq++
	req.FirstRouteId, req.SyncSeq = r.firstRouteID, r.syncSeq
	r.fence(req)
	return req
}

// maxFenceIDs bounds each list of a Sync's fence; past it the Sync sends
// no fence, and the leader takes the counts as they are.
const maxFenceIDs = 1 << 15

// fence adds to a Sync what its counts cannot include yet (see
// decider.SyncFence): the calls without an answer, the abandon reports and
// completions not yet acknowledged, and how many ticketed requests have
// finished. mu held, as when the counts were taken.
func (r *Router) fence(req *cartv1.SyncRequest) {
	nOpen := len(r.open) + r.abandons.len() + len(r.sentAbandons)
	nUnsettled := r.pending.len() + len(r.sentTickets)
	if nOpen > maxFenceIDs || nUnsettled > maxFenceIDs {
		return
	}
	req.LastRouteId, req.DoneSeq = r.lastRouteID, r.doneSeq
	req.OpenRouteIds = make([]uint64, 0, nOpen)
	for id := range r.open {
		req.OpenRouteIds = append(req.OpenRouteIds, id)
	}
	for id := range r.sentAbandons {
		req.OpenRouteIds = append(req.OpenRouteIds, id)
	}
	req.UnsettledTickets = make([]uint64, 0, nUnsettled)
	for id := range r.sentTickets {
		req.UnsettledTickets = append(req.UnsettledTickets, id)
	}
	for _, c := range r.abandons.q {
		req.OpenRouteIds = append(req.OpenRouteIds, c.GetRouteId())
	}
	for _, c := range r.pending.q {
		req.UnsettledTickets = append(req.UnsettledTickets, c.GetTicket())
	}
}

// flushAllAt is the number of queued completions at which all of them
// are sent at once, aged or not. Abandon reports do not count: a burst of
// them must not make every Done send the few completions queued since.
const flushAllAt = 256

// queueSeenFor is how long after an answer that saw the leader's queue
// hold requests completions are flushed one by one: answers keep coming
// while the pool is saturated, so this only bounds the tail.
const queueSeenFor = time.Second

// flushKind says why flush runs.
type flushKind int

const (
	flushTick  flushKind = iota // the interval: aged reports; what stays is aged from now on
	flushFull                   // flushAllAt completions queued, or requests wait for room: all of them, no abandon report
	flushFinal                  // the data plane stops: everything
)

func (r *Router) flushLoop(ctx context.Context) {
	t := time.NewTicker(r.o.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			// What was queued when ctx ended. Riders that a Route call
			// still in flight puts back after this are lost with the
			// process: the leader drops this data plane's load when its
			// lease lapses.
			r.flush(context.Background(), flushFinal)
			return
		case <-t.C:
			r.flushUnlessDone(ctx, flushTick)
		case <-r.flushNow:
			r.flushUnlessDone(ctx, flushFull)
		}
	}
}

// flushUnlessDone flushes unless ctx has ended: select picks at random
// between a tick and ctx's end when both are ready, and a flush on an
// ended ctx would fail and drop what the last flush is there to send.
func (r *Router) flushUnlessDone(ctx context.Context, kind flushKind) {
	if ctx.Err() == nil {
		r.flush(ctx, kind)
	}
}

// flush sends queued reports in a Complete call. On a tick it sends those
// already queued at the tick before, so a report waits one to two
// FlushIntervals (a rider put back by a failed call also its RouteTimeout),
// and at a route every few milliseconds nearly every completion rides
// with a Route call instead (openCall), a stream message less each. Only
// ticks age what stays, and only ticks send abandon reports, so that one
// queued just before a full queue is flushed still waits for its call to
// reach the leader first. If the control plane cannot take them they are
// queued again (requeue), and no full queue forces a flush until one
// works.
func (r *Router) flush(ctx context.Context, kind flushKind) {
	r.mu.Lock()
	full := kind == flushFull || r.pending.len() >= flushAllAt
	batch := r.pending.due(kind == flushFinal || full)
	if kind != flushFull {
		batch = append(batch, r.abandons.due(kind == flushFinal)...)
	}
	if kind == flushTick {
		r.pending.tick()
		r.abandons.tick()
	}
	r.sending(batch, 1)
	r.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	var err error
	defer func() {
		r.mu.Lock()
		r.sending(batch, -1)
		r.flushFailed = err != nil
		if err != nil && kind != flushFinal {
			r.requeue(batch)
		}
		r.mu.Unlock()
	}()
	target := r.current()
	if target == "" {
		err = errors.New("no control plane")
		return
	}
	fctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err = r.completeCall(fctx, target, &cartv1.CompleteRequest{DataplaneId: r.o.ID, Completions: batch}); err != nil {
		r.logRPCError("report completions failed", target, err, "completions", len(batch))
		if causeOf(err) != "timeout" {
			r.rotate(target) // a dead node must not keep receiving every report
		}
	}
}

// maxQueuedReports bounds each report queue while the control plane
// cannot take them: past it the oldest are dropped (the leader's stale
// rule then settles their tickets, and their load is not in the Syncs).
const maxQueuedReports = 1 << 15

// requeue puts back the reports of a failed Complete call: it may have
// reached the leader (a timeout) or not, and either way the reports stay
// in the Syncs' fence until one is acknowledged; settling twice is a
// no-op. mu held.
func (r *Router) requeue(batch []*cartv1.Completion) {
	var done, abandoned []*cartv1.Completion
	for _, c := range batch {
		if c.GetAbandoned() {
			abandoned = append(abandoned, c)
		} else {
			done = append(done, c)
		}
	}
	r.pending.putBack(done)
	r.abandons.putBack(abandoned)
	for _, q := range []*reports{&r.pending, &r.abandons} {
		if over := q.len() - maxQueuedReports; over > 0 {
			q.take(over)
		}
	}
}

// authWarnEvery bounds the rejected-token warning to one line per period:
// every request and every sync would otherwise log it.
const authWarnEvery = 10 * time.Second

// logRPCError logs a failed control-plane call. Transient failures are
// debug noise (the data plane falls back and retries), but a rejected
// cluster token is a misconfiguration that silently degrades routing to
// local fallback for good, so it is a warning.
func (r *Router) logRPCError(msg, target string, err error, attrs ...any) {
	if causeOf(err) != "auth" {
		r.log.Debug(msg, append([]any{"control_plane", target, "error", err.Error()}, attrs...)...)
		return
	}
	if !r.authWarned.Allow(time.Now(), authWarnEvery) {
		return
	}
	r.log.Warn("the control plane rejected this data plane's cluster token (auth.token / auth.token_file): routing locally until it is fixed",
		append([]any{"control_plane", target, "during", msg, "error", err.Error()}, attrs...)...)
}

// WorkerSource is where url came from, as the last Sync said
// (router.SourceUnknown when this data plane does not know it).
func (r *Router) WorkerSource(url string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sourceOf(url)
}
