package remote

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"github.com/cartrouter/cart/controlplane/flow"
	"github.com/cartrouter/cart/dataplane/router"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// Flow control on a data plane. The queue is the leader's: a Route call
// that finds the pool saturated waits there, fleet-wide, and this data
// plane waits for its final answer on the stream (doQueued). What stays
// here is what the leader cannot do while it is away:
//   - a call queued at the leader whose stream breaks (a leader change, a
//     partition) is asked again, of the next leader, with its first
//     arrival, so it keeps its place; the old call is reported abandoned,
//     and the old leader, if it still leads, has already taken it out of
//     its queue (its stream ended) or releases what it decided for it;
//   - while no leader answers (local fallback), a request that finds every
//     worker it may use saturated, by this data plane's own in-flight
//     counts against the limits the last Sync named, waits in a local
//     queue with the same policy (priority, token fairness, deadlines,
//     bounds). Fairness is then per data plane. When a leader answers
//     again, the waiting requests are handed over to it, again with their
//     first arrival.

// FlowOptions configure the data plane's side of flow control.
type FlowOptions struct {
	// On sends admissions to the leader and queues locally during a
	// fallback; off: a saturated pool is a 503, as before flow control.
	On           bool
	Limits       flow.Limits
	QueueTimeout time.Duration
	RetryAfter   time.Duration
}

// errHandOver: a request waiting in the local queue is to be asked of the
// leader, which answers again.
var errHandOver = errors.New("the control plane answers again: the request goes to its queue")

// maxRouteRounds bounds how often one request is asked again after its
// queued call's stream broke or it was handed over.
const maxRouteRounds = 8

type localWaiter struct {
	req   *router.Request
	ready chan localGrant // buffered: the dispatch never blocks
	item  *flow.Item[*localWaiter]
}

type localGrant struct {
	d   router.Decision
	err error
}

func (r *Router) flowOn() bool { return r.o.Flow.On }

// queueDeadline is when req stops waiting: its arrival plus the queue
// timeout, or its own deadline if earlier.
func (r *Router) queueDeadline(req *router.Request) time.Time {
	a := req.Admission
	arrival := a.Arrival
	if arrival.IsZero() {
		arrival = time.Now()
	}
	d := arrival.Add(r.o.Flow.QueueTimeout)
	if !a.Deadline.IsZero() && a.Deadline.Before(d) {
		d = a.Deadline
	}
	return d
}

// admission is req's Admission for the Route call when it can wait in the
// leader's queue: on a stream whose leader queues, which sends an interim
// answer. A unary call (or an older leader) sends none: a saturated pool is
// then a 503, as before flow control.
func (r *Router) admission(req *router.Request, queue bool) *cartv1.Admission {
	if !r.flowOn() || req.DryRun || !queue {
		return nil
	}
	a := req.Admission
	m := &cartv1.Admission{Tenant: a.Tenant, Label: a.Label, Priority: int32(a.Priority), Weight: a.Weight,
		Bytes: a.Bytes, Cost: a.Cost, Queue: queue}
	if !a.Arrival.IsZero() {
		m.ArrivalUnixMicros = a.Arrival.UnixMicro()
	}
	if !a.Deadline.IsZero() {
		m.DeadlineUnixMicros = a.Deadline.UnixMicro()
	}
	if queue {
		m.QueueDeadlineUnixMicros = r.queueDeadline(req).UnixMicro()
	}
	return m
}

// refused turns the leader's FlowRefused detail into the proxy's 429.
func refused(err error) (*router.RefusedError, bool) {
	ce, ok := errors.AsType[*connect.Error](err)
	if !ok || ce.Code() != connect.CodeResourceExhausted {
		return nil, false
	}
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if derr != nil {
			continue
		}
		if fr, ok := v.(*cartv1.FlowRefused); ok {
			return &router.RefusedError{Reason: fr.GetReason(), RetryAfter: time.Duration(fr.GetRetryAfterMillis()) * time.Millisecond,
				Err: errors.New(ce.Message())}, true
		}
	}
	return nil, false
}

// limitOf is a worker's in-flight limit on this data plane's own counts
// during a fallback: its max_load or concurrency, whichever is lower.
func limitOf(w router.WorkerStatus) int {
	l := w.MaxLoad
	if c := w.Concurrency; c > 0 && (l == 0 || c < l) {
		l = c
	}
	return l
}

// waitLocal queues req locally while the fallback finds every worker it
// may use saturated. r.mu held on entry; released on return.
func (r *Router) waitLocal(ctx context.Context, req *router.Request) (router.Decision, error) {
	a := req.Admission
	retry := r.o.Flow.RetryAfter
	if a.Priority < 0 {
		r.mu.Unlock()
		return router.Decision{}, &router.RefusedError{Reason: router.RefusedShed, RetryAfter: retry,
			Err: errors.New("the pool is saturated and this request's priority is sheddable (below 0): refused rather than queued")}
	}
	deadline := r.queueDeadline(req)
	w := &localWaiter{req: req, ready: make(chan localGrant, 1)}
	w.item = &flow.Item[*localWaiter]{Tenant: a.Tenant, Priority: a.Priority, Weight: a.Weight, Deadline: deadline.UnixNano(),
		Bytes: a.Bytes, Cost: a.Cost, Value: w}
	if err := r.lq.Push(w.item); err != nil {
		r.mu.Unlock()
		reason := router.RefusedQueueFull
		if full, ok := errors.AsType[*flow.ErrFull](err); ok && full.Scope == "tenant" {
			reason = router.RefusedTenantFull
		}
		return router.Decision{}, &router.RefusedError{Reason: reason, RetryAfter: retry, Err: err}
	}
	back := r.leaderBack
	r.mu.Unlock()
	if a.OnQueued != nil {
		a.OnQueued()
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case g := <-w.ready:
		return g.d, g.err
	case <-ctx.Done():
		return r.leaveLocal(w, ctx.Err())
	case <-timer.C:
		return r.leaveLocal(w, &router.RefusedError{Reason: router.RefusedTimeout, RetryAfter: retry,
			Err: fmt.Errorf("no worker had room within the queue timeout (%s; control plane unreachable, queued on this data plane)", r.o.Flow.QueueTimeout)})
	case <-back:
		return r.leaveLocal(w, errHandOver)
	}
}

// leaveLocal takes w out of the local queue with err; if a dispatch gave
// it a worker meanwhile, that worker's count is given back.
func (r *Router) leaveLocal(w *localWaiter, err error) (router.Decision, error) {
	r.mu.Lock()
	if r.lq.Remove(w.item) {
		r.mu.Unlock()
		return router.Decision{}, err
	}
	g := <-w.ready // sent under mu by the dispatch that took it
	if g.err == nil {
		r.releaseLocked(g.d.Worker)
	}
	r.mu.Unlock()
	return router.Decision{}, err
}

// releaseLocked gives back one in-flight request on worker and offers the
// room to the local queue. r.mu held.
func (r *Router) releaseLocked(worker string) {
	if r.local[worker] > 0 {
		r.local[worker]--
		if r.local[worker] == 0 {
			delete(r.local, worker)
		}
	}
	r.pumpLocked()
}

// pumpLocked dispatches locally queued requests while workers have room.
// r.mu held.
func (r *Router) pumpLocked() {
	if r.lq == nil || r.lq.Len() == 0 {
		return
	}
	r.lq.Dispatch(64, func(it *flow.Item[*localWaiter]) flow.Verdict {
		w := it.Value
		d, full, err := r.pickLocked(w.req)
		switch {
		case err == nil:
			w.ready <- localGrant{d: d}
			return flow.Taken
		case full:
			return flow.Skip
		}
		w.ready <- localGrant{err: err}
		return flow.Dropped
	})
}

// leaderIsBack hands the locally queued requests over to the leader, which
// answers again. r.mu held.
func (r *Router) leaderIsBackLocked() {
	if r.lq != nil && r.lq.Len() > 0 {
		close(r.leaderBack)
		r.leaderBack = make(chan struct{})
	}
}

// StreamLive reports whether a Route stream to the leader is open (the
// queue's interim answers need one).
func (r *Router) StreamLive() bool { return r.streams != nil && r.streams.cur.Load() != nil }

// waitStream waits until a stream to a leader that queues is live again,
// or until deadline or ctx's end, and reports whether it is.
func (r *Router) waitStream(ctx context.Context, deadline time.Time) bool {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if st := r.streams.live(r.current()); st != nil && st.queues {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			if !time.Now().Before(deadline) {
				return false
			}
		}
	}
}
