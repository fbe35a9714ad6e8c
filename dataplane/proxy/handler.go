package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/cartrouter/cart/dataplane/apierr"
	"github.com/cartrouter/cart/dataplane/extract"
	"github.com/cartrouter/cart/dataplane/router"
	"github.com/cartrouter/cart/internal/tracing"
)

// call is one client request on its way through the proxy.
type call struct {
	id        string // CART's request id (X-Request-Id to the worker)
	clientID  string // the client's own X-Request-Id, sanitized, for logs
	endpoint  string // metric label
	tenant    string // metric and log label: a configured client key name or AnonymousTenant
	anthropic bool   // errors go out in the Anthropic shape
	model     string
	body      []byte
	hashes    []uint64
	keyLen    int
	session   string
	routed    bool // prefix-routed (vs pass-through)
	noResend  bool // never resend once a worker may have seen it
	failed    []string
	final     router.Decision
	attempts  int
	start     time.Time
	client    *http.ResponseController // the client's connection, for deadlines
	hold      bodyHold                 // body bytes reserved in the budget

	// out is the request the attempts send, each on its own copy with its
	// worker's address (built by outbound). It, the writer and the 1xx
	// hook live here, not on their own, to save allocations per request.
	out    http.Request
	outURL url.URL
	sw     statusWriter
	rc     http.ResponseController
	hints  interim
	trace  httptrace.ClientTrace

	// modelExclude are the workers that do not serve the request's model.
	modelExclude []string
	// pin is the only worker this call may go to (the one storing the
	// response it refers to), "" when unpinned.
	pin             string
	learnResponseID bool // a Responses API answer: remember its id's worker
	// responseID is the stored response the call names, responseParam the
	// field it came from ("" for /v1/responses/{id}).
	responseID, responseParam string
	// admission is the call's flow-control identity (admission.go).
	admission router.Admission
	// pd is the call's prefill/decode state (pd.go).
	pd pdCall
}

// logArgs adds the client's own request id, when it sent one, to the
// arguments of a log line about the call.
func (c *call) logArgs(args ...any) []any {
	if c.clientID != "" {
		args = append(args, "client_request_id", c.clientID)
	}
	return args
}

// maxPooledHashes bounds the hash buffers kept for reuse (64k blocks = a
// 4 MB prompt at the default block size).
const maxPooledHashes = 1 << 16

// maxPooledKey bounds the key buffers kept for reuse.
const maxPooledKey = 64 << 10

var keyPool = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

var hashPool = sync.Pool{New: func() any { s := make([]uint64, 0, 256); return &s }}

func (p *Proxy) routed(ep extract.Endpoint) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tenant, ok := p.authenticate(w, r, ep.String())
		if !ok {
			return
		}
		p.serveRouted(ep, w, r, tenant)
	}
}

func (p *Proxy) serveRouted(ep extract.Endpoint, w http.ResponseWriter, r *http.Request, tenant string) {
	c := p.newCall(r, ep.String(), tenant)
	c.routed = true
	defer c.hold.free()
	body, err := p.readBody(w, r, c)
	if err != nil {
		p.fail(w, c, err)
		return
	}
	kp := keyPool.Get().(*[]byte)
	req, err := extract.AppendKeyOptions((*kp)[:0], ep, body, p.o.Extract)
	defer func() {
		// The key text is only hashed: its buffer serves the next
		// request, unless a huge prompt grew it.
		if req != nil && cap(req.Key) <= maxPooledKey {
			*kp = req.Key[:0]
			keyPool.Put(kp)
		}
	}()
	if err != nil {
		p.fail(w, c, err)
		return
	}
	if err := p.mediaRefusal(extract.Media{Remote: req.RemoteMediaURL, File: req.FileMediaURL}); err != nil {
		p.fail(w, c, err)
		return
	}
	if err := p.filterModel(c, req.Model); err != nil {
		p.fail(w, c, err)
		return
	}
	if body, err = p.isolateCache(w, ep, c, body, req); err != nil {
		p.fail(w, c, err)
		return
	}
	if ep == extract.Responses {
		if err := p.prepareResponses(c, req); err != nil {
			p.fail(w, c, err)
			return
		}
	}
	hp := hashPool.Get().(*[]uint64)
	defer func() {
		// Keep only ordinary buffers: a huge prompt's slice would stay
		// pinned in the pool for good.
		if cap(*hp) <= maxPooledHashes {
			*hp = (*hp)[:0]
			hashPool.Put(hp)
		}
	}()
	salt := req.CacheSalt
	if !extract.SaltHonored(ep) {
		// The engine ignores it there: requests with and without it share
		// its cache, and so must their hashes.
		salt = ""
	}
	*hp = router.Hash((*hp)[:0], req.Model, salt, req.Key, p.o.BlockChars)
	c.body, c.model, c.hashes, c.keyLen = body, req.Model, *hp, len(req.Key)
	c.session = p.sessionKey(r, req)
	p.preparePD(c, ep)
	p.forward(w, r, c)
}

// isolateCache gives the request of a tenant whose cache is isolated its
// cache_salt (auth.go), in the body the worker gets and in req, whose
// salt seeds the block hashes: the index then never matches the tenant's
// prefixes with another's either. Other tenants' bodies are returned as
// they came.
func (p *Proxy) isolateCache(w http.ResponseWriter, ep extract.Endpoint, c *call, body []byte, req *extract.Request) ([]byte, error) {
	salt, ok := p.auth.cacheSalt(c.tenant, req.CacheSalt)
	if !ok {
		return body, nil
	}
	if !extract.SaltHonored(ep) {
		return nil, extract.ErrCacheSaltUnsupported(ep)
	}
	out, err := extract.SetCacheSalt(body, salt)
	if err != nil {
		return nil, err
	}
	// The copy replaces the body (the old one is garbage now): the budget
	// holds the few bytes it grew by.
	if n := int64(len(out) - len(body)); n > 0 && !c.hold.grow(n) {
		return nil, overBudget(w)
	}
	req.CacheSalt = salt
	return out, nil
}

// sessionKey returns the first session key present, in configured order,
// as a fixed-size hash: the value is the client's choice and may be
// megabytes long, and it travels to the control plane and sits in the
// session table for the whole TTL, where only its identity matters.
func (p *Proxy) sessionKey(r *http.Request, req *extract.Request) string {
	v := p.rawSessionKey(r, req)
	if v == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(v))
	return hex.EncodeToString(sum[:16])
}

func (p *Proxy) rawSessionKey(r *http.Request, req *extract.Request) string {
	for _, k := range p.o.SessionKeys {
		var v string
		switch {
		case k == "prompt_cache_key":
			v = req.PromptCacheKey
		case k == "user":
			v = req.User
		case strings.HasPrefix(k, "header:"):
			v = r.Header.Get(strings.TrimPrefix(k, "header:"))
		}
		if v != "" {
			return v
		}
	}
	return ""
}

// filterModel keeps the call away from workers that do not serve model,
// or refuses it when no worker does.
func (p *Proxy) filterModel(c *call, model string) error {
	ex, err := p.o.Models.Exclude(model)
	if err != nil {
		return apierr.New(http.StatusNotFound, apierr.TypeInvalidRequest, "model_not_found",
			"The model `%s` does not exist: no worker of this pool serves it.", truncate(model, 256))
	}
	c.modelExclude = ex
	return nil
}

// passThroughModel is the top-level "model" of a JSON pass-through body
// (embeddings, rerank, score, tokenize...), "" when there is none. It reads
// the key as the engines do: exact case (a struct tag would also match
// "MODEL"), the last of duplicates winning (a map keeps the last).
func passThroughModel(r *http.Request, body []byte) string {
	if len(body) == 0 || !strings.Contains(r.Header.Get("Content-Type"), "json") {
		return ""
	}
	var top map[string]json.RawMessage
	var model string
	if json.Unmarshal(body, &top) != nil || json.Unmarshal(top["model"], &model) != nil {
		return ""
	}
	return model
}

func tooLarge(limit int64) error {
	return apierr.New(http.StatusRequestEntityTooLarge, apierr.TypeInvalidRequest, "body_too_large",
		"request body exceeds the limit of %d bytes (proxy.max_body_bytes)", limit)
}

func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, c *call) {
	if err := p.admission(w, r, c); err != nil {
		p.fail(w, c, err)
		return
	}
	if o := pickerOf(r); o != nil {
		p.pick(w, r, c, o) // picker.go: a gateway dispatches
		return
	}
	p.active.Add(1)
	defer p.active.Add(-1)
	c.sw.ResponseWriter = w
	sw := &c.sw
	c.rc = *http.NewResponseController(sw)
	c.client = &c.rc
	defer func() {
		v := recover()
		p.finish(r, c, sw, v != nil)
		if v != nil {
			panic(v) // http.ErrAbortHandler: let the server drop the connection
		}
	}()
	c.hints.w = sw
	c.trace.Got1xxResponse = c.hints.got1xx
	ctx := httptrace.WithClientTrace(r.Context(), &c.trace)
	p.outbound(r, c)
	resp, err := p.roundTrip(ctx, c)
	c.hints.close()
	if err != nil {
		p.errorHandler(sw, r, c, err)
		return
	}
	p.relay(sw, r, c, resp)
}

// finish records the request's final status. A client that went away is
// logged as 499, never blamed on the worker.
func (p *Proxy) finish(r *http.Request, c *call, sw *statusWriter, aborted bool) {
	status := sw.status
	if status == 0 {
		status = http.StatusOK
	}
	if r.Context().Err() != nil && (aborted || sw.status == 0 || sw.clientGone) {
		status = 499
		p.m.ClientDisconnects.Inc()
	}
	worker := c.final.Worker
	tracing.Annotate(r.Context(), c.endpoint, c.tenant, c.model, worker)
	p.m.Requests.WithLabelValues(c.endpoint, statusLabel(status), worker, c.tenant).Inc()
	if status == 499 || aborted {
		p.log.Info("request ended early", c.logArgs("request_id", c.id, "endpoint", c.endpoint, "tenant", c.tenant, "status", status, "worker", worker,
			"duration_ms", p.o.Now().Sub(c.start).Milliseconds(), "client_gone", r.Context().Err() != nil)...)
	}
}

// statusLabel is the status label of cart_requests_total: the class, with
// client hang-ups (499) apart so they never pass for malformed requests.
func statusLabel(s int) string {
	if s == 499 {
		return "499"
	}
	if s >= 100 && s < 600 {
		return statusText[s/100]
	}
	return "other"
}

var statusText = [6]string{"0xx", "1xx", "2xx", "3xx", "4xx", "5xx"}

func (p *Proxy) fail(w http.ResponseWriter, c *call, err error) {
	ae := upstreamError(err)
	if c.anthropic {
		apierr.WriteAnthropic(w, ae)
	} else {
		apierr.Write(w, ae)
	}
	p.m.Requests.WithLabelValues(c.endpoint, statusLabel(ae.Status), "", c.tenant).Inc()
	p.log.Info("request refused", c.logArgs("request_id", c.id, "endpoint", c.endpoint, "tenant", c.tenant, "status", ae.Status, "code", ae.Code, "error", clip(err.Error()))...)
}

// errorHandler answers a call that got no usable response.
func (p *Proxy) errorHandler(w http.ResponseWriter, r *http.Request, c *call, err error) {
	if r.Context().Err() != nil {
		// The client left; nobody is listening for an error body.
		return
	}
	ae, refused := refusal(w, err)
	if !refused {
		ae = upstreamError(err)
	}
	if ae.Status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	apierr.WriteFor(w, r, ae)
	p.log.Warn("request failed", c.logArgs("request_id", c.id, "endpoint", c.endpoint, "tenant", c.tenant, "status", ae.Status, "attempts", c.attempts, "error", err.Error())...)
}

// upstreamError is what a client is told about a failure behind the proxy.
// Transport errors name internal addresses ("dial tcp 10.0.3.7:8000:
// connect: connection refused"), so the client gets only the kind of
// failure; the details go to the log under the request id.
func upstreamError(err error) *apierr.Error {
	var ae *apierr.Error
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, router.ErrUnavailable):
		// The router's own capacity messages ("every usable worker is at
		// max_load"), which name no worker.
		return apierr.New(http.StatusServiceUnavailable, apierr.TypeUnavailable, "no_worker_available", "%v", err)
	case isTimeout(err):
		return apierr.New(http.StatusGatewayTimeout, apierr.TypeServer, "upstream_timeout", "upstream did not answer in time")
	}
	return apierr.New(http.StatusBadGateway, apierr.TypeServer, "upstream_unreachable", "upstream unavailable")
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
