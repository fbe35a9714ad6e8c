package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"time"

	"github.com/cartrouter/cart/dataplane/apierr"
	"github.com/cartrouter/cart/dataplane/router"
)

// decide asks the router, keeping breaker-open workers out unless that
// would leave nobody: then the open breakers are ignored and a trial
// request goes through, because refusing every client is worse than
// probing a replica that may have recovered.
func (p *Proxy) decide(ctx context.Context, c *call) (router.Decision, error) {
	base := c.failed
	if c.pin != "" {
		base = p.pinExclude(c)
	} else if len(c.modelExclude) > 0 {
		base = append(append(make([]string, 0, len(c.failed)+len(c.modelExclude)), c.failed...), c.modelExclude...)
	}
	exclude := base
	if blocked := p.o.Breakers.Blocked(p.o.Now()); len(blocked) > 0 {
		exclude = append(append(make([]string, 0, len(base)+len(blocked)), base...), blocked...)
	}
	req := &router.Request{ID: c.id, Model: c.model, Exclude: exclude}
	if c.pin == "" {
		req.ResponseID = c.responseID
	}
	if c.routed {
		req.Endpoint, req.Hashes, req.KeyLen, req.Session = c.endpoint, c.hashes, c.keyLen, c.session
	}
	d, err := p.o.Router.Route(ctx, req)
	if err != nil && len(exclude) > len(base) && errors.Is(err, router.ErrUnavailable) {
		req.Exclude = base
		d, err = p.o.Router.Route(ctx, req)
		if err == nil {
			p.log.Warn("every usable worker has an open circuit breaker; sending a trial request anyway", "request_id", c.id, "worker", d.Worker)
		}
	}
	if errors.Is(err, router.ErrResponseGone) {
		return d, responseGone(c.responseID, c.responseParam)
	}
	if err != nil {
		if c.pin != "" && errors.Is(err, router.ErrUnavailable) {
			// A stored response lives on that replica only: another one
			// would not find it, so the client waits for this one.
			return d, apierr.New(http.StatusServiceUnavailable, apierr.TypeUnavailable, "response_replica_unavailable",
				"the replica storing this response (%s) cannot take the request now (unhealthy or at max load); retry later", c.pin)
		}
		return d, err
	}
	p.pinFromRouter(c, d)
	if c.pin != "" && d.Worker != c.pin {
		// A router that knows a worker this data plane has not synced yet
		// may pick it despite the exclusions: the response lives on the pin
		// only, and any other replica would answer 404.
		p.o.Router.Done(d, router.Outcome{Delivered: false, PromptTokens: -1, CachedTokens: -1})
		return router.Decision{}, apierr.New(http.StatusServiceUnavailable, apierr.TypeServer, "response_replica_unavailable",
			"the replica holding %s cannot take requests right now; retry later", truncate(c.responseID, maxResponseIDLen))
	}
	if c.routed {
		p.m.Decisions.WithLabelValues(d.Reason).Inc()
		p.m.MatchedRatio.Observe(d.MatchedRatio)
		p.m.DecisionLatency.Observe(d.Latency.Seconds())
		p.log.Info("route",
			"request_id", c.id, "endpoint", c.endpoint, "tenant", c.tenant, "model", clip(c.model), "reason", d.Reason,
			"matched_ratio", math.Round(d.MatchedRatio*1000)/1000, "matched_chars", d.MatchedChars,
			"worker", d.Worker, "decision_us", d.Latency.Microseconds(), "attempt", c.attempts)
	}
	return d, nil
}

type retryableStatus struct{ resp *http.Response }

func (e *retryableStatus) Error() string { return fmt.Sprintf("worker answered %s", e.resp.Status) }

// dispatch sends one attempt to d.Worker. On a connection error or a
// retryable status it settles the decision (load released, placement
// withdrawn) and reports the failure; on success it hands the response to
// deliver, which settles the decision when the body is done.
func (p *Proxy) dispatch(ctx context.Context, out *http.Request, c *call, d router.Decision) (*http.Response, error) {
	target, err := p.workerURL(d.Worker)
	if err != nil {
		p.o.Router.Done(d, router.Outcome{Delivered: false, PromptTokens: -1, CachedTokens: -1})
		return nil, err
	}
	actx, cancel := context.WithCancel(ctx)
	// out is already ReverseProxy's private copy, and no attempt changes
	// its headers: a shallow copy with its own URL is enough per attempt.
	req := out.WithContext(actx)
	u := *out.URL
	req.URL = &u
	req.URL.Scheme, req.URL.Host = target.Scheme, target.Host
	req.URL.Path = singleJoin(target.Path, out.URL.Path)
	req.URL.RawPath = ""
	req.Host = ""
	if p.workerKeys.get(d.Worker) != "" {
		// Keys differ per worker, so this attempt needs its own headers.
		req.Header = out.Header.Clone()
		p.setWorkerAuth(req.Header, d.Worker)
	}
	req.ContentLength = int64(len(c.body))
	req.Body = http.NoBody
	if len(c.body) > 0 {
		req.Body = newBodyReader(c.body)
		req.GetBody = func() (io.ReadCloser, error) { return newBodyReader(c.body), nil }
	}
	p.m.InFlight.WithLabelValues(d.Worker).Inc()
	p.o.Breakers.Begin(d.Worker)
	sent := p.o.Now()
	resp, err := p.upstream.RoundTrip(req)
	if err != nil {
		cancel()
		p.m.InFlight.WithLabelValues(d.Worker).Dec()
		clientGone := ctx.Err() != nil
		// A client hang-up is not the worker's fault, and the worker may
		// well have seen the request: keep the placement.
		p.o.Router.Done(d, router.Outcome{Delivered: clientGone, PromptTokens: -1, CachedTokens: -1})
		if clientGone {
			p.o.Breakers.Abandon(d.Worker)
		} else {
			p.o.Breakers.Failure(d.Worker, p.o.Now())
			p.log.Warn("upstream attempt failed", "request_id", c.id, "worker", d.Worker, "attempt", c.attempts, "error", err.Error())
		}
		return nil, err
	}
	p.m.UpstreamTTFB.WithLabelValues(d.Worker).Observe(p.o.Now().Sub(sent).Seconds())
	if p.isRetryable(resp.StatusCode) {
		p.o.Breakers.Failure(d.Worker, p.o.Now())
		p.log.Warn("upstream attempt rejected", "request_id", c.id, "worker", d.Worker, "attempt", c.attempts, "status", resp.StatusCode)
		resp.Body = &releaseOnce{ReadCloser: resp.Body, cancel: cancel, done: func() {
			p.m.InFlight.WithLabelValues(d.Worker).Dec()
			p.o.Router.Done(d, router.Outcome{Delivered: false, PromptTokens: -1, CachedTokens: -1})
		}}
		return nil, &retryableStatus{resp: resp}
	}
	p.o.Breakers.Success(d.Worker)
	resp.Body = &releaseOnce{ReadCloser: resp.Body, cancel: cancel, done: func() { p.m.InFlight.WithLabelValues(d.Worker).Dec() }}
	return p.deliver(c, d, resp, false), nil
}

// deliver makes resp the final answer: its body is watched for stalls and
// usage, and closing it settles the decision exactly once.
func (p *Proxy) deliver(c *call, d router.Decision, resp *http.Response, rejected bool) *http.Response {
	c.final = d
	// No retry can follow: the body is no longer needed, and a long
	// stream must not keep its prompt's bytes counted against new uploads.
	c.body = nil
	c.hold.free()
	inner := resp.Body.(*releaseOnce)
	tb := &trackedBody{rc: inner, idle: p.o.StreamIdleTimeout, cancel: func() {
		inner.cancel()
		// A client that stopped reading blocks ReverseProxy in Write,
		// where cancelling the upstream cannot reach it: expire the write
		// too, so the stream ends and its load is released.
		if c.client != nil {
			_ = c.client.SetWriteDeadline(time.Now())
		}
	}}
	prev := inner.done
	inner.done = func() {
		prev()
		if rejected {
			return // the rejected decision was already settled by its own done
		}
		u := tb.usage()
		p.o.Router.Done(d, router.Outcome{Delivered: true, PromptTokens: u.prompt, CachedTokens: u.cached})
		p.observeUsage(c, d, u)
	}
	tb.start()
	resp.Body = tb
	return resp
}

func (p *Proxy) observeUsage(c *call, d router.Decision, u usage) {
	if u.prompt <= 0 || u.cached < 0 || !c.routed {
		return
	}
	p.m.PromptTokens.WithLabelValues(d.Worker).Add(float64(u.prompt))
	p.m.CachedTokens.WithLabelValues(d.Worker).Add(float64(u.cached))
	predictedTokens := float64(d.ChosenChars) / charsPerToken
	p.m.PredictedCached.WithLabelValues(d.Worker).Add(predictedTokens)
	if c.keyLen > 0 {
		p.m.CachedFraction.WithLabelValues("predicted").Observe(float64(d.ChosenChars) / float64(c.keyLen))
	}
	p.m.CachedFraction.WithLabelValues("actual").Observe(float64(u.cached) / float64(u.prompt))
}

// charsPerToken converts index characters to tokens until the index is
// token-aware (the usual 4 characters per token of English text).
