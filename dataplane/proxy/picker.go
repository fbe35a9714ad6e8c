package proxy

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/cartrouter/cart/dataplane/router"
)

// Endpoint picking. An endpoint picker (dataplane/epp) forwards nothing: a
// gateway does, to the worker the picker names. The picker runs this
// handler on every request it is asked about, so that authentication, the
// body limits and budget, extraction, the media policy, the model filter,
// cache isolation, Responses API pins, session keys and flow control are
// the proxy's own, line for line. Only the last step differs: where
// forward would dispatch, the handler hands the decision to the picker
// (the hook the request's context carries) and keeps it, as it keeps an
// attempt, until the picker says how the gateway's exchange ended. What
// the handler answers itself (an error, GET /v1/models, /health) is
// written to its ResponseWriter as usual, for the picker to relay.

type pickerKey struct{}

// PickOptions say how a picker wants a request picked.
type PickOptions struct {
	// Exclude returns the workers (URLs) the decision must not name (those
	// outside the gateway's subset hint); it is called when the request is
	// routed, on the handler's goroutine. Nil excludes none.
	Exclude func() []string
	// Picked receives the decision, on the handler's goroutine. It must
	// not block: the handler then waits until the Pick is finished or the
	// request's context ends.
	Picked func(*Pick)
}

// WithPicker returns a context under which the proxy's handler picks
// instead of forwarding.
func WithPicker(ctx context.Context, o PickOptions) context.Context {
	return context.WithValue(ctx, pickerKey{}, &o)
}

func pickerOf(r *http.Request) *PickOptions {
	o, _ := r.Context().Value(pickerKey{}).(*PickOptions)
	return o
}

// Pick is one routed request whose dispatch is someone else's (a
// gateway's). It holds the router's decision like an attempt does: the
// decision is settled exactly once, by Finish (or ServedBy), or as a
// client hang-up when the request's context ends first.
type Pick struct {
	// ID is CART's request id (the worker's X-Request-Id).
	ID string
	// Tenant, Endpoint and Model label the request as the proxy does.
	Tenant, Endpoint, Model string
	// Worker is the chosen worker's URL. Candidate is the worker holding
	// the longest prefix when another was chosen (load), "" otherwise.
	Worker, Candidate string
	// Pinned: only Worker can serve the request (it stores the response
	// the request refers to), so there is no fallback.
	Pinned bool
	// Exclude are the workers the decision could not name (the model
	// filter, the picker's own exclusions, a pin); Avoid those with an
	// open circuit breaker.
	Exclude, Avoid []string
	// Body is what the worker must receive: the client's body, or CART's
	// rewrite of it (cache_salt, engine priority). It is valid until
	// Dispatched.
	Body []byte
	// WorkerKey is the key Worker expects (vLLM --api-key), "" for none.
	WorkerKey string
	// RoutedPeerHeader: proxy.add_routed_peer_header is on.
	RoutedPeerHeader bool

	p    *Proxy
	a    *attempt
	ctx  context.Context // the request's, for what outlives it
	done chan struct{}
	once sync.Once

	mu         sync.Mutex
	dispatched time.Time
	status     int          // the worker's answer, 0 before it started
	sniff      *trackedBody // the answer's head and tail, for usage
	ids        *responseIDSniffer
	elsewhere  bool // the gateway reported another worker served it
	gone       bool // the exchange broke off (a client that hung up)
}

// pick is forward's last step for a request under WithPicker: route, hand
// the decision over, and hold it until the Pick is finished.
func (p *Proxy) pick(w http.ResponseWriter, r *http.Request, c *call, o *PickOptions) {
	if o.Exclude != nil {
		c.failed = append(c.failed, o.Exclude()...)
	}
	c.attempts = 1
	// One endpoint is the whole answer: the two legs of a split request
	// are the proxy's to run, so a picker routes every request whole (a
	// split decision's prefill ticket would never be settled).
	c.pd.on = false
	ctx := r.Context()
	a, err := p.begin(ctx, c)
	if err != nil {
		sw := &statusWriter{ResponseWriter: w}
		p.errorHandler(sw, r, c, err)
		status := sw.status
		if status == 0 {
			status = 499 // the client left: nothing was written
		}
		p.recordPick(r, c, status, "")
		return
	}
	c.final = a.d
	pk := &Pick{ID: c.id, Tenant: c.tenant, Endpoint: c.endpoint, Model: c.model,
		Worker: a.d.Worker, Candidate: a.d.Candidate, Pinned: c.pin != "",
		Exclude: p.excluded(c), Avoid: p.o.Breakers.Blocked(p.o.Now()),
		Body: c.body, WorkerKey: p.workerKeys.get(a.d.Worker, a.d.Source), RoutedPeerHeader: p.o.AddRoutedPeerHeader,
		p: p, a: a, ctx: ctx, done: make(chan struct{})}
	if pk.Candidate == pk.Worker {
		pk.Candidate = ""
	}
	o.Picked(pk)
	select {
	case <-pk.done:
	case <-ctx.Done():
		pk.Finish(true)
	}
	pk.mu.Lock()
	status := pk.status
	if pk.gone {
		status = 499
	}
	pk.mu.Unlock()
	p.recordPick(r, c, status, pk.Worker)
}

// recordPick counts the request as finish does a forwarded one: 499 for
// an exchange that broke off (a client that hung up, as the proxy logs
// it), 0 ("other") for one that ended without an answer the picker saw.
func (p *Proxy) recordPick(r *http.Request, c *call, status int, worker string) {
	if status == 499 {
		p.m.ClientDisconnects.Inc()
		p.log.Info("request ended early", c.logArgs("request_id", c.id, "endpoint", c.endpoint, "tenant", c.tenant, "status", status, "worker", worker,
			"duration_ms", p.o.Now().Sub(c.start).Milliseconds(), "client_gone", r.Context().Err() != nil)...)
	}
	p.m.Requests.WithLabelValues(c.endpoint, statusLabel(status), worker, c.tenant).Inc()
}

// Dispatched says the gateway has the decision (and the body): from here
// the worker may see the request. The body is no longer the Pick's.
func (pk *Pick) Dispatched() {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	if !pk.dispatched.IsZero() || pk.a.settled.Load() {
		return
	}
	p, c := pk.p, pk.a.c
	w, err := p.worker(pk.Worker)
	if err != nil {
		return
	}
	pk.a.w = w
	pk.dispatched = p.o.Now()
	w.inFlight.Inc()
	p.o.Breakers.Begin(pk.Worker)
	// As deliver does: a long stream must not keep its prompt's bytes
	// counted against new uploads.
	c.body, pk.Body = nil, nil
	c.hold.free()
}

// Refuse ends a Pick the picker could not hand to the gateway, answering
// status itself: the decision is settled as undelivered.
func (pk *Pick) Refuse(status int) {
	pk.mu.Lock()
	if pk.dispatched.IsZero() {
		pk.status = status
	}
	pk.mu.Unlock()
	pk.Finish(false)
}

// Response says the worker's answer began with status.
func (pk *Pick) Response(status int) {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	if pk.status != 0 || pk.dispatched.IsZero() || pk.elsewhere {
		return
	}
	p := pk.p
	pk.status = status
	pk.a.w.ttfb.Observe(p.o.Now().Sub(pk.dispatched).Seconds())
	if p.isRetryable(status) {
		pk.a.rejected = true
		p.o.Breakers.Failure(pk.Worker, p.o.Now())
	} else {
		p.o.Breakers.Success(pk.Worker)
	}
	pk.sniff = &trackedBody{}
	if c := pk.a.c; c.learnResponseID && status/100 == 2 {
		pk.ids = &responseIDSniffer{learn: p.learnResponseID(c, context.WithoutCancel(pk.ctx))}
	}
}

// ResponseBody passes a chunk of the answer: its usage report is read at
// the end, a Responses API answer's id learned on the way.
func (pk *Pick) ResponseBody(b []byte) {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	if pk.sniff == nil || len(b) == 0 {
		return
	}
	pk.sniff.see(b)
	if pk.ids != nil {
		pk.ids.observe(b)
	}
}

// ServedBy takes the gateway's report of the worker that served the
// request. Another worker than the one chosen (the gateway fell back):
// the decision is settled at once as undelivered, so the chosen worker's
// load is released and its placement withdrawn (it never saw the prompt).
func (pk *Pick) ServedBy(worker string) {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	if worker == pk.Worker || pk.elsewhere || pk.a.settled.Load() {
		return
	}
	pk.elsewhere = true
	p := pk.p
	p.o.Breakers.Failure(pk.Worker, p.o.Now())
	pk.release()
	pk.a.settle(undelivered)
	p.log.Info("gateway served the request on another worker", "request_id", pk.ID, "chosen", pk.Worker, "served", worker)
}

// release drops what Dispatched took on the chosen worker.
func (pk *Pick) release() {
	if pk.a.w != nil && !pk.dispatched.IsZero() {
		pk.a.w.inFlight.Dec()
		pk.dispatched = time.Time{}
	}
}

// Finish ends the exchange: the decision is settled with the worker's
// usage report (or as undelivered when it never got the request or
// refused it), and the handler holding the Pick returns. clientGone: the
// gateway's stream broke off (a client disconnect) rather than ending.
func (pk *Pick) Finish(clientGone bool) {
	pk.once.Do(func() {
		defer close(pk.done)
		pk.mu.Lock()
		defer pk.mu.Unlock()
		pk.gone = clientGone
		p, a := pk.p, pk.a
		if pk.elsewhere {
			return // settled by ServedBy
		}
		sent := !pk.dispatched.IsZero()
		if sent && pk.status == 0 {
			// No answer seen: not the worker's fault.
			p.o.Breakers.Abandon(pk.Worker)
		}
		u := usage{prompt: -1, cached: -1, completion: -1}
		if pk.sniff != nil {
			u = pk.sniff.usage()
			pk.sniff.release()
		}
		pk.release()
		switch {
		case !sent, a.rejected:
			a.settle(undelivered)
		default:
			// A client that hung up may still have reached the worker:
			// the placement is kept, as the proxy keeps it.
			a.settle(router.Outcome{Delivered: true, PromptTokens: u.prompt, CachedTokens: u.cached, CompletionTokens: u.completion})
			if !clientGone && a.w != nil {
				p.observeUsage(a.c, a.d, a.w, u)
			}
		}
	})
}
