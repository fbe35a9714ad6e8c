package service

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/decider"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// admission turns a Route call's Admission into the decider's, and the
// context the call waits in the queue with. A call that waits outlives the
// data plane's route timeout: once queued, the stream's expiry no longer
// applies, the queue deadline the data plane sent does. It ends early when
// the data plane reports the call abandoned (its client left) or the call
// itself ends (the stream broke, the unary call was cancelled).
func (c *Core) admission(ctx context.Context, m *cartv1.RouteRequest, a *cartv1.Admission, caller *decider.Caller, queued func()) (decider.Admission, context.Context, context.CancelFunc) {
	adm := decider.Admission{
		Tenant: clip(a.GetTenant(), maxTenantLen), Label: clip(a.GetLabel(), maxTenantLen),
		Priority: clampPriority(a.GetPriority()), Weight: a.GetWeight(),
		Bytes: max(a.GetBytes(), 0), Cost: max(a.GetCost(), 0),
	}
	if t := a.GetArrivalUnixMicros(); t > 0 {
		adm.Arrival = time.UnixMicro(t)
	}
	if t := a.GetDeadlineUnixMicros(); t > 0 {
		adm.Deadline = time.UnixMicro(t)
	}
	if !a.GetQueue() {
		// The caller reads no interim answer, so it cannot wait: on a
		// saturated pool it is refused at once, like a sheddable request.
		adm.Priority = min(adm.Priority, -1)
		return adm, ctx, func() {}
	}
	if t := a.GetQueueDeadlineUnixMicros(); t > 0 && (adm.Deadline.IsZero() || time.UnixMicro(t).Before(adm.Deadline)) {
		adm.Deadline = time.UnixMicro(t)
	}
	wait, cancel := context.WithCancel(ctx)
	key := routeKey{m.GetDataplaneId(), m.GetRouteId()}
	var waiting atomic.Bool
	expired := caller.Expired
	caller.Expired = func() bool { return !waiting.Load() && expired != nil && expired() }
	adm.OnQueued = func() {
		waiting.Store(true)
		if key.id != 0 {
			c.queuedCalls.add(key, cancel)
		}
		if queued != nil {
			queued()
		}
	}
	return adm, wait, func() {
		cancel()
		if key.id != 0 {
			c.queuedCalls.remove(key)
		}
	}
}

// maxTenantLen bounds the tenant names a data plane sends: they key the
// queue's fairness table and label its metrics.
const maxTenantLen = 256

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func clampPriority(p int32) int {
	return int(min(max(p, config.MinPriority), config.MaxPriority))
}

type routeKey struct {
	dp string
	id uint64
}

// queuedCalls are the Route calls waiting in the flow-control queue, by
// (data plane, route id): an abandon report for one ends its wait, so a
// request whose client left leaves the fleet-wide queue at once rather
// than at its timeout.
type queuedCalls struct {
	mu sync.Mutex
	m  map[routeKey]context.CancelFunc
}

func (q *queuedCalls) add(k routeKey, cancel context.CancelFunc) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.m == nil {
		q.m = map[routeKey]context.CancelFunc{}
	}
	q.m[k] = cancel
}

func (q *queuedCalls) remove(k routeKey) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.m, k)
}

// cancel ends the wait of queued call k, if it still waits.
func (q *queuedCalls) cancel(k routeKey) {
	q.mu.Lock()
	f := q.m[k]
	q.mu.Unlock()
	if f != nil {
		f()
	}
}
