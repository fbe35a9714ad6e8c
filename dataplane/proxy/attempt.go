package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/cartrouter/cart/dataplane/apierr"
	"github.com/cartrouter/cart/dataplane/router"
)

// begin asks the router, keeping breaker-open workers out unless that
// would leave nobody: they go to the router as its soft avoid list, so a
// trial request to a replica that may have recovered costs the same one
// Route call, because refusing every client is worse than probing. The
// decision comes back as an attempt, which owes the router its one
// settlement.
func (p *Proxy) begin(ctx context.Context, c *call) (*attempt, error) {
	req := &router.Request{ID: c.id, Model: c.model, Exclude: p.excluded(c), Avoid: p.o.Breakers.Blocked(p.o.Now()), Admission: c.admission, Disagg: c.pd.disagg()}
	if c.pin == "" && c.responseID != "" {
		req.ResponseID, req.Tenant = c.responseID, c.tenant
	}
	if c.routed {
		req.Endpoint, req.Hashes, req.KeyLen, req.Session = c.endpoint, c.hashes, c.keyLen, c.session
	}
	d, err := p.decide(ctx, c, req)
	if err == nil && d.AvoidIgnored {
		p.log.Warn("every usable worker has an open circuit breaker; sending a trial request anyway", "request_id", c.id, "worker", d.Worker)
	}
	if errors.Is(err, router.ErrResponseGone) {
		return nil, responseGone(c.responseID, c.responseParam)
	}
	if errors.Is(err, router.ErrResponseNotFound) {
		return nil, responseNotFound(c.responseID)
	}
	if err != nil {
		if c.pin != "" && errors.Is(err, router.ErrUnavailable) {
			// A stored response lives on that replica only: another one
			// would not find it, so the client waits for this one.
			return nil, apierr.New(http.StatusServiceUnavailable, apierr.TypeUnavailable, "response_replica_unavailable",
				"the replica storing this response (%s) cannot take the request now (unhealthy or at max load); retry later", c.pin)
		}
		return nil, err
	}
	a := &attempt{p: p, c: c, d: d, n: c.attempts}
	// attempt start: the decision is held from here until settle.
	if err := p.splitAttempt(a); err != nil {
		if a.pre != nil {
			a.pre.settle(undelivered)
		}
		a.settle(undelivered)
		return nil, err
	}
	p.pinFromRouter(c, d)
	if c.pin != "" && d.Worker != c.pin {
		// A router that knows a worker this data plane has not synced yet
		// may pick it despite the exclusions: the response lives on the pin
		// only, and any other replica would answer 404.
		a.settle(undelivered) // never split: a request naming a response goes whole
		return nil, apierr.New(http.StatusServiceUnavailable, apierr.TypeServer, "response_replica_unavailable",
			"the replica holding %s cannot take requests right now; retry later", truncate(c.responseID, maxResponseIDLen))
	}
	if c.routed {
		p.decisionCounter(d.Reason).Inc()
		p.m.MatchedRatio.Observe(d.MatchedRatio)
		p.m.DecisionLatency.Observe(d.Latency.Seconds())
		if p.log.Enabled(ctx, slog.LevelInfo) {
			args := c.logArgs(
				"request_id", c.id, "endpoint", c.endpoint, "tenant", c.tenant, "model", clip(c.model), "reason", d.Reason,
				"matched_ratio", math.Round(d.MatchedRatio*1000)/1000, "matched_chars", d.MatchedChars,
				"worker", d.Worker, "decision_us", d.Latency.Microseconds(), "attempt", c.attempts,
				"queued_ms", d.Waited.Milliseconds(), "priority", c.admission.Priority)
			if d.Prefill != nil {
				args = append(args, "prefill_worker", d.Prefill.Worker, "prefill_reason", d.Prefill.Reason)
			}
			if d.Whole != "" {
				args = append(args, "whole", d.Whole)
			}
			p.log.Info("route", args...)
		}
	}
	return a, nil
}

// excluded are the workers c's next attempt must not go to: those that
// failed it, those not serving its model, or all but its pin.
func (p *Proxy) excluded(c *call) []string {
	switch {
	case c.pin != "":
		return p.pinExclude(c)
	case len(c.modelExclude) > 0:
		return append(append(make([]string, 0, len(c.failed)+len(c.modelExclude)), c.failed...), c.modelExclude...)
	}
	return c.failed
}

// attempt is one try of a call on one worker, in the shape of Caddy's
// proxy loop iteration: the retry loop (retry.go) asks begin for one, sends
// it, and either returns its response or records its failure and loops.
// An attempt holds the router's decision from the moment Route returns it
// and owes the router exactly one Done. settle is the only way to pay it:
// the paths that end an attempt (a transport error, a retryable answer
// dropped or delivered, the response body finished, a client abort, a
// stalled stream) race, and whichever comes first pays.
type attempt struct {
	p *Proxy
	c *call
	d router.Decision
	n int // 1-based, within the call

	w      *workerInfo
	url    url.URL            // the request's, with the worker's address
	cancel context.CancelFunc // ends the upstream exchange; set by send
	// rejected: the worker answered a retryable status, so the worker did
	// not process the request, even if that answer is delivered in the end.
	rejected bool
	body     *trackedBody // the delivered body, read for usage at the end

	// A split request's legs (pd.go): pre is the prefill leg of a pair,
	// leg what this attempt is, reqBody the body it sends when not the
	// call's, blame the worker a failure is put down to when not its own
	// (the prefill leg's), sent when it was sent and handoff when its
	// prefill answer was read.
	pre           *attempt
	leg           leg
	reqBody       []byte
	blame         string
	sent, handoff time.Time

	settled atomic.Bool
}

// undelivered settles a decision the worker never processed: load
// released, placement withdrawn so the index has no phantom holder.
var undelivered = router.Outcome{Delivered: false, PromptTokens: -1, CachedTokens: -1}

// settle hands the decision back to the router, once: later calls are
// no-ops and report false.
func (a *attempt) settle(o router.Outcome) bool {
	if !a.settled.CompareAndSwap(false, true) {
		return false
	}
	a.p.o.Router.Done(a.d, o)
	// attempt end: the decision is settled.
	return true
}

type retryableStatus struct {
	resp *http.Response
	a    *attempt
}

func (e *retryableStatus) Error() string { return fmt.Sprintf("worker answered %s", e.resp.Status) }

// send dispatches the attempt to its worker. On a connection error it
// settles at once and reports the failure; on a retryable status it
// reports the failure with the answer still open (closing it settles); on
// success it delivers the response, whose end settles.
func (a *attempt) send(ctx context.Context) (*http.Response, error) {
	p, c, d := a.p, a.c, a.d
	if a.pre != nil {
		// Whatever happens, the prefill leg is settled once (a no-op
		// after its own settlement).
		defer a.pre.settle(undelivered)
		if !p.o.Disagg.Sidecar {
			if resp, err, done := a.runPrefill(ctx); done {
				return resp, err
			}
		}
	}
	w, err := p.worker(d.Worker)
	if err != nil {
		a.settle(undelivered)
		return nil, err
	}
	a.w = w
	if c.noResend {
		// The transport must not send it twice either.
		ctx = context.WithValue(ctx, noResendKey{}, true)
	}
	actx, cancel := context.WithCancel(ctx)
	a.cancel = cancel
	// No attempt changes the call's outbound headers: a shallow copy with
	// its own URL is enough per attempt.
	out := &c.out
	req := out.WithContext(actx)
	a.url = *out.URL
	req.URL = &a.url
	req.URL.Scheme, req.URL.Host = w.url.Scheme, w.url.Host
	req.URL.Path = singleJoin(w.url.Path, out.URL.Path)
	req.URL.RawPath = ""
	if out.URL.RawPath != "" || w.url.RawPath != "" {
		// The path has escapes its decoded form would lose: a "%2F" sent
		// as "/" is another path to the worker (a response id decoding to
		// "../../sim/stats"). Joined escaped, it reaches the worker as the
		// client wrote it.
		req.URL.RawPath = singleJoin(w.url.EscapedPath(), out.URL.EscapedPath())
	}
	req.Host = ""
	own := false
	if p.workerKeys.get(d.Worker, d.Source) != "" {
		// Keys differ per worker, so this attempt needs its own headers.
		req.Header = out.Header.Clone()
		p.setWorkerAuth(req.Header, d.Worker, d.Source)
		own = true
	}
	req.Header = a.legHeaders(req.Header, own)
	body := c.body
	if a.reqBody != nil {
		body = a.reqBody
	}
	req.ContentLength = int64(len(body))
	req.Body = http.NoBody
	if len(body) > 0 {
		newBody := newBodyReader
		if len(body) <= smallBody {
			newBody = newSmallBodyReader
		}
		req.Body, _ = newBody(body)
		req.GetBody = func() (io.ReadCloser, error) { return newBody(body) }
	}
	w.inFlight.Inc()
	p.o.Breakers.Begin(d.Worker)
	sent := p.o.Now()
	a.sent = sent
	resp, err := p.o.Tracer.RoundTrip(p.upstream, req, d.Worker, a.n)
	a.sidecarDone(err, err == nil && p.isRetryable(resp.StatusCode))
	if err != nil {
		a.decodeFailed(!neverSent(err))
		cancel()
		w.inFlight.Dec()
		clientGone := ctx.Err() != nil
		// A client hang-up is not the worker's fault, and the worker may
		// well have seen the request: keep the placement.
		a.settle(router.Outcome{Delivered: clientGone, PromptTokens: -1, CachedTokens: -1})
		if clientGone {
			p.o.Breakers.Abandon(d.Worker)
		} else {
			p.o.Breakers.Failure(d.Worker, p.o.Now())
			p.log.Warn("upstream attempt failed", "request_id", c.id, "worker", d.Worker, "attempt", a.n, "error", err.Error())
		}
		return nil, err
	}
	w.ttfb.Observe(p.o.Now().Sub(sent).Seconds())
	resp.Body = &attemptBody{ReadCloser: resp.Body, a: a}
	if p.isRetryable(resp.StatusCode) {
		a.rejected = true
		p.o.Breakers.Failure(d.Worker, p.o.Now())
		p.log.Warn("upstream attempt rejected", "request_id", c.id, "worker", d.Worker, "attempt", a.n, "status", resp.StatusCode)
		return nil, &retryableStatus{resp: resp, a: a}
	}
	p.o.Breakers.Success(d.Worker)
	if a.leg == legPrefill {
		return resp, nil // read by runPrefill
	}
	return a.delivered(a.deliver(resp)), nil
}

// deliver makes resp, this attempt's answer, the call's final one: its
// body is watched for stalls and usage, and closing it settles.
func (a *attempt) deliver(resp *http.Response) *http.Response {
	c := a.c
	c.final = a.d
	// No retry can follow: the body is no longer needed, and a long
	// stream must not keep its prompt's bytes counted against new uploads.
	c.body = nil
	c.hold.free()
	inner := resp.Body.(*attemptBody)
	tb := &trackedBody{rc: inner, idle: a.p.o.StreamIdleTimeout, cancel: func() {
		a.cancel()
		// A client that stopped reading blocks relay in Write,
		// where cancelling the upstream cannot reach it: expire the write
		// too, so the stream ends and its load is released.
		if c.client != nil {
			_ = c.client.SetWriteDeadline(time.Now())
		}
	}}
	a.body = tb
	tb.start()
	resp.Body = tb
	return resp
}

// finish runs once, when the attempt's response body is closed: the
// upstream exchange ends and the decision is settled, with the worker's
// usage report when it delivered the answer.
func (a *attempt) finish() {
	a.cancel()
	a.w.inFlight.Dec()
	if a.rejected || a.body == nil {
		a.settle(undelivered)
		return
	}
	u := a.body.usage()
	a.body.release()
	a.settle(router.Outcome{Delivered: true, PromptTokens: u.prompt, CachedTokens: u.cached, CompletionTokens: u.completion})
	if a.leg != legDecode {
		// A decode engine counts the prompt it was sent as cached: its
		// report says nothing of the index's prediction (the prefill
		// leg's does, runPrefill).
		a.p.observeUsage(a.c, a.d, a.w, u)
	}
}

// attemptBody is an attempt's upstream response body: closing it, on
// whichever of relay's paths (normal end, client abort, error) gets
// there first, finishes the attempt once.
type attemptBody struct {
	io.ReadCloser
	a    *attempt
	once atomic.Bool
}

func (b *attemptBody) Close() error {
	err := b.ReadCloser.Close()
	if b.once.CompareAndSwap(false, true) {
		b.a.finish()
	}
	return err
}

func (p *Proxy) observeUsage(c *call, d router.Decision, w *workerInfo, u usage) {
	if u.prompt <= 0 || u.cached < 0 || !c.routed {
		return
	}
	w.promptTokens.Add(float64(u.prompt))
	w.cachedTokens.Add(float64(u.cached))
	w.predictedCached.Add(float64(d.ChosenChars) / router.CharsPerToken)
	if c.keyLen > 0 {
		p.predictedFraction.Observe(float64(d.ChosenChars) / float64(c.keyLen))
	}
	p.actualFraction.Observe(float64(u.cached) / float64(u.prompt))
}
