// Package proxy is the data plane's HTTP front: it reads and checks a
// request, extracts its prompt key, asks a router.Router where to send it,
// and streams the worker's answer back, retrying on another worker while no
// byte has reached the client. The same Proxy runs in the all-in-one mode
// (with an in-process router) and in a data plane (with the control-plane
// client); it never knows which.
package proxy

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/cartrouter/cart/controlplane/affinity"
	"github.com/cartrouter/cart/controlplane/models"
	"github.com/cartrouter/cart/dataplane/apierr"
	"github.com/cartrouter/cart/dataplane/breaker"
	"github.com/cartrouter/cart/dataplane/extract"
	"github.com/cartrouter/cart/dataplane/metrics"
	"github.com/cartrouter/cart/dataplane/router"
	"github.com/cartrouter/cart/internal/tracing"
)

// Headers CART owns. Inbound copies are stripped so a client cannot spoof
// them.
const (
	HeaderRoutedPeer = "X-Routed-Peer"
	HeaderRequestID  = "X-Request-Id"
)

// Options configure a Proxy (proxy.* in the configuration, as durations).
type Options struct {
	Router   router.Router
	Breakers *breaker.Set
	Metrics  *metrics.Metrics
	Logger   *slog.Logger

	BlockChars          int
	MaxBodyBytes        int64
	BodyReadTimeout     time.Duration // time allowed to receive the request body
	AddRoutedPeerHeader bool
	RemoteMediaPolicy   int  // 0 allows remote media URLs; else the status to refuse with
	AllowFileMediaURLs  bool // the policy lets file: media URLs through

	// PassThroughPaths are the paths other than the routed ones that are
	// forwarded ("/x" exactly, "/x/*" under /x/); nil forwards none.
	// RetryablePassThroughPaths, in the same form, are the ones whose
	// non-GET requests may be resent to another worker after one may have
	// seen them.
	PassThroughPaths          []string
	RetryablePassThroughPaths []string

	// MaxInflightBodyBytes bounds the body bytes held by all requests
	// together (0 = no bound); MaxItems the array items of one routed
	// request (0 = no bound). See budget.go and items.go.
	MaxInflightBodyBytes int64
	MaxItems             int

	ConnectTimeout    time.Duration // TCP+TLS handshake to a worker
	RequestTimeout    time.Duration // dispatch until the worker's response headers
	StreamIdleTimeout time.Duration // longest silence between response chunks; 0 = none

	MaxRetries        int
	InitialBackoff    time.Duration
	MaxBackoff        time.Duration
	BackoffMultiplier float64
	JitterFactor      float64
	RetryableStatuses []int
	RetryBudgetRatio  float64
	RetryBudgetMin    int

	ModelsCacheTTL time.Duration
	// Models, when set, is which models each worker serves: a request is
	// routed only among the workers serving its model (404
	// model_not_found when none does), and /v1/models answers the union of
	// the healthy workers' lists. While no worker's list is known, neither
	// happens (requests route as if unfiltered; /v1/models is fetched from
	// one worker and cached for ModelsCacheTTL).
	Models *models.Registry

	// Extract changes how key text is derived (ignored system prefixes).
	// Its zero value ignores nothing; the config default ignores Claude
	// Code's billing header.
	Extract extract.Options

	// ResponseAffinityTTL and ResponseAffinityMax bound the table of
	// Responses API ids -> the worker that produced them (responses.*);
	// zero picks the defaults.
	ResponseAffinityTTL time.Duration
	ResponseAffinityMax int

	// SessionKeys, in order, name where a request's session key comes
	// from: "header:<Name>", "prompt_cache_key" or "user". Empty disables
	// session affinity.
	SessionKeys []string

	// ClientKeys, when not empty, are required on every proxied path
	// (Authorization: Bearer or x-api-key); the matching key's name is the
	// tenant label. AdminToken guards /workers; empty restricts it to
	// loopback callers. WorkerKeys are sent to workers instead of the
	// client's credentials, which are never forwarded.
	ClientKeys []ClientKey
	AdminToken string
	WorkerKeys WorkerKeys
	// MetricsElsewhere: /metrics is served on its own listener, so the
	// client listener answers 404 for it (rather than passing it through).
	MetricsElsewhere bool

	// Tracer traces each upstream attempt and annotates the request span
	// (internal/tracing); nil is tracing off.
	Tracer *tracing.Tracer

	// Transport overrides the upstream transport (tests); nil builds one
	// from the timeouts above.
	Transport http.RoundTripper
	Now       func() time.Time
}

// Proxy is the data plane's request handler.
type Proxy struct {
	o         Options
	rp        *httputil.ReverseProxy
	upstream  http.RoundTripper
	retryable [600]bool
	mux       *http.ServeMux
	log       *slog.Logger
	m         *metrics.Metrics

	active      atomic.Int64 // requests being proxied (retry budget base)
	retryTokens atomic.Int64 // retry attempts in progress

	workerURLs sync.Map // worker URL string -> *url.URL

	rngMu sync.Mutex
	rng   *mrand.Rand

	models   modelsCache
	affinity *affinity.Table[string]

	auth                  clientAuth
	workerKeys            workerKeys
	passPaths, retryPaths pathSet
	budget                *bodyBudget // nil: no bound
}

// New builds a Proxy.
func New(o Options) *Proxy {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Metrics == nil {
		o.Metrics = metrics.New(nil)
	}
	if o.BodyReadTimeout <= 0 {
		o.BodyReadTimeout = time.Minute
	}
	p := &Proxy{o: o, log: o.Logger, m: o.Metrics, rng: mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 0x5eed))}
	p.auth = newClientAuth(o.ClientKeys, o.AdminToken)
	p.SetWorkerKeys(o.WorkerKeys)
	for _, s := range o.RetryableStatuses {
		if s >= 0 && s < len(p.retryable) {
			p.retryable[s] = true
		}
	}
	p.upstream = o.Transport
	if p.upstream == nil {
		p.upstream = NewTransport(o.ConnectTimeout, o.RequestTimeout)
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:   p.rewrite,
		Transport: roundTripFunc(p.roundTrip),
		// 0, not -1: ReverseProxy already flushes every chunk of
		// text/event-stream and unknown-length (chunked) responses at once,
		// so streams keep their time to first token, while fixed-length
		// JSON answers go out in one write instead of a flush per read.
		FlushInterval:  0,
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.errorHandler,
		BufferPool:     copyBuffers{},
		ErrorLog:       slog.NewLogLogger(o.Logger.Handler(), slog.LevelWarn),
	}
	p.models.ttl = o.ModelsCacheTTL
	p.affinity = affinity.New[string](o.ResponseAffinityTTL, o.ResponseAffinityMax)
	p.passPaths, p.retryPaths = newPathSet(o.PassThroughPaths), newPathSet(o.RetryablePassThroughPaths)
	if o.MaxInflightBodyBytes > 0 {
		p.budget = &bodyBudget{limit: o.MaxInflightBodyBytes}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", p.routed(extract.ChatCompletions))
	mux.HandleFunc("POST /v1/completions", p.routed(extract.Completions))
	mux.HandleFunc("POST /v1/messages", p.routed(extract.Messages))
	mux.HandleFunc("POST /v1/responses", p.routed(extract.Responses))
	mux.HandleFunc("GET /v1/responses/{id}", p.storedResponse)
	mux.HandleFunc("DELETE /v1/responses/{id}", p.storedResponse)
	mux.HandleFunc("GET /v1/responses/{id}/input_items", p.storedResponse)
	mux.HandleFunc("POST /v1/responses/{id}/cancel", p.storedResponse)
	mux.HandleFunc("GET /health", p.handleHealth)
	mux.HandleFunc("GET /workers", p.handleWorkers)
	if o.MetricsElsewhere {
		mux.HandleFunc("GET /metrics", http.NotFound)
	} else {
		mux.Handle("GET /metrics", o.Metrics.Handler())
	}
	mux.HandleFunc("GET /v1/models", p.handleModels)
	mux.HandleFunc("/", p.passThrough)
	p.mux = mux
	return p
}

// NewTransport is the upstream transport: connect timeout bounds only the
// handshake so a dead worker fails fast, and the request timeout bounds the
// wait for response headers, leaving long streams alone.
func NewTransport(connect, request time.Duration) *http.Transport {
	d := &net.Dialer{Timeout: connect, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:                 nil, // never send inference traffic through an environment proxy
		DialContext:           d.DialContext,
		TLSHandshakeTimeout:   connect,
		ResponseHeaderTimeout: request,
		MaxIdleConns:          4096,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		ForceAttemptHTTP2:     true,
		DisableCompression:    true, // pass encodings through untouched
	}
}

// ServeHTTP implements http.Handler.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor == 1 && len(r.TransferEncoding) > 0 {
		// A message with both Transfer-Encoding and Content-Length may be
		// a smuggling attempt, and RFC 9112 section 6.3 wants the
		// connection closed after it. net/http accepts it (chunked wins)
		// and deletes Content-Length before the handler runs, so the two
		// cannot be told apart here: every HTTP/1 request with a transfer
		// coding closes its connection. Clients rarely send one (SDKs send
		// Content-Length), so keep-alive is lost only for those requests.
		w.Header().Set("Connection", "close")
	}
	p.mux.ServeHTTP(w, r)
}

// copyBuffers recycles ReverseProxy's 32 KiB copy buffers, which it would
// otherwise allocate for every response.
type copyBuffers struct{}

var copyBufferPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (copyBuffers) Get() []byte  { return *copyBufferPool.Get().(*[]byte) }
func (copyBuffers) Put(b []byte) { copyBufferPool.Put(&b) }

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// call is one client request on its way through the proxy.
type call struct {
	id        string
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

	// modelExclude are the workers that do not serve the request's model.
	modelExclude []string
	// pin is the only worker this call may go to (the one storing the
	// response it refers to), "" when unpinned.
	pin             string
	learnResponseID bool // a Responses API answer: remember its id's worker
	// responseID is the stored response the call names, responseParam the
	// field it came from ("" for /v1/responses/{id}).
	responseID, responseParam string
}

type callKey struct{}

func callFrom(ctx context.Context) *call {
	c, _ := ctx.Value(callKey{}).(*call)
	return c
}

// maxPooledHashes bounds the hash buffers kept for reuse (64k blocks = a
// 4 MB prompt at the default block size).
const maxPooledHashes = 1 << 16

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
	c := &call{id: requestID(r), endpoint: ep.String(), tenant: tenant, anthropic: apierr.IsAnthropicPath(r.URL.Path), routed: true, start: p.o.Now()}
	defer c.hold.free()
	body, err := p.readBody(w, r, c)
	if err != nil {
		p.fail(w, c, err)
		return
	}
	if err := checkItems(body, p.o.MaxItems); err != nil {
		p.fail(w, c, err)
		return
	}
	req, err := extract.ExtractOptions(ep, body, p.o.Extract)
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
	*hp = router.Hash((*hp)[:0], req.Model, req.CacheSalt, req.Key, p.o.BlockChars)
	c.body, c.model, c.hashes, c.keyLen = body, req.Model, *hp, len(req.Key)
	c.session = p.sessionKey(r, req)
	p.forward(w, r, c)
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
	p.active.Add(1)
	defer p.active.Add(-1)
	sw := &statusWriter{ResponseWriter: w}
	c.client = http.NewResponseController(sw)
	defer func() {
		v := recover()
		p.finish(r, c, sw, v != nil)
		if v != nil {
			panic(v) // http.ErrAbortHandler: let the server drop the connection
		}
	}()
	ctx := context.WithValue(r.Context(), callKey{}, c)
	p.rp.ServeHTTP(sw, r.WithContext(ctx))
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
		p.log.Info("request ended early", "request_id", c.id, "endpoint", c.endpoint, "tenant", c.tenant, "status", status, "worker", worker,
			"duration_ms", p.o.Now().Sub(c.start).Milliseconds(), "client_gone", r.Context().Err() != nil)
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
	p.log.Info("request refused", "request_id", c.id, "endpoint", c.endpoint, "tenant", c.tenant, "status", ae.Status, "code", ae.Code, "error", clip(err.Error()))
}

func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	pr.SetXForwarded()
	pr.Out.Header.Del(HeaderRoutedPeer)
	pr.Out.Header.Del("Upgrade") // see modifyResponse: no upgraded connections
	for _, h := range clientCredentialHeaders {
		pr.Out.Header.Del(h)
	}
	c := callFrom(pr.In.Context())
	pr.Out.Header.Set(HeaderRequestID, c.id)
}

func (p *Proxy) modifyResponse(resp *http.Response) error {
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// An upgraded connection would outlive the body wrapper that
		// settles the decision; returning an error makes ReverseProxy
		// close the body (settling it) and answer 502.
		return errors.New("protocol upgrades are not proxied")
	}
	c := callFrom(resp.Request.Context())
	resp.Header.Del(HeaderRoutedPeer)
	if p.o.AddRoutedPeerHeader && c != nil {
		resp.Header.Set(HeaderRoutedPeer, c.final.Worker)
	}
	return nil
}

func (p *Proxy) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	c := callFrom(r.Context())
	if r.Context().Err() != nil {
		// The client left; nobody is listening for an error body.
		return
	}
	ae := upstreamError(err)
	if ae.Status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	apierr.WriteFor(w, r, ae)
	if c != nil {
		p.log.Warn("request failed", "request_id", c.id, "endpoint", c.endpoint, "tenant", c.tenant, "status", ae.Status, "attempts", c.attempts, "error", err.Error())
	}
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

// roundTrip is the ReverseProxy's transport: it routes, dispatches, and
// retries on another worker while the response has not started. Returning
// from here is the last moment a retry is possible: after it ReverseProxy
// starts writing to the client.
//
// When no other worker can take a retry, the client gets the last real
// failure (the worker's own retryable answer, or a 504/502 for a timeout or
// connection error), not a generic "no worker available".
func (p *Proxy) roundTrip(out *http.Request) (*http.Response, error) {
	c := callFrom(out.Context())
	ctx := out.Context()
	var tokens int64
	defer func() { p.retryTokens.Add(-tokens) }()
	// held is the last retryable answer, kept open until another worker has
	// been found for the retry: if none can be, it is delivered as is.
	var held *http.Response
	var heldD router.Decision
	drop := func() {
		if held != nil {
			_ = held.Body.Close()
			held = nil
		}
	}
	var lastErr error
	unsent := false // the last attempt provably never reached its worker
	for attempt := 0; ; attempt++ {
		// A worker that refused the connection says nothing about the
		// others: retry elsewhere at once rather than back off.
		if attempt > 0 && !unsent {
			if err := sleepCtx(ctx, p.backoff(attempt)); err != nil {
				drop()
				return nil, err
			}
		}
		c.attempts++
		d, err := p.decide(ctx, c)
		if err != nil {
			if held != nil {
				return p.deliver(c, heldD, held, true), nil
			}
			if lastErr != nil {
				return nil, fmt.Errorf("%w (no other worker to retry on: %v)", lastErr, err)
			}
			return nil, err
		}
		drop()
		resp, err := p.dispatch(ctx, out, c, d)
		if err == nil {
			return p.sniffResponseID(c, resp), nil
		}
		var rs *retryableStatus
		errors.As(err, &rs)
		if ctx.Err() != nil {
			if rs != nil {
				_ = rs.resp.Body.Close()
			}
			return nil, ctx.Err()
		}
		unsent = rs == nil && neverSent(err)
		if !c.mayResend(err) || !p.takeRetry(attempt, unsent) {
			if rs != nil {
				// Out of retries: the worker's own answer is the most
				// useful thing to give the client.
				return p.deliver(c, d, rs.resp, true), nil
			}
			return nil, err
		}
		if !unsent {
			tokens++
		}
		lastErr = err
		c.failed = append(c.failed, d.Worker)
		if rs != nil {
			held, heldD = rs.resp, d
		}
	}
}

// takeRetry reports whether the attempt that just failed (0-based) may be
// retried, taking a retry-budget token if so. An attempt that never reached
// its worker (unsent) is retried outside the budget, which exists to keep
// retries from multiplying the load on sick workers: a refused connection
// put no load on anyone, and turning it into a 502 while healthy workers
// remain would make a replica kill visible to clients. MaxRetries and the
// set of workers not yet tried still bound it.
func (p *Proxy) takeRetry(attempt int, unsent bool) bool {
	if attempt >= p.o.MaxRetries {
		return false
	}
	if unsent {
		p.m.Retries.WithLabelValues("not_sent").Inc()
		return true
	}
	if !p.reserveRetryToken() {
		p.m.RetryBudgetExhaus.Inc()
		return false
	}
	p.m.Retries.WithLabelValues("upstream_failure").Inc()
	return true
}

// neverSent reports whether a transport error proves the request never
// left for the worker: the connection was never established (dial errors:
// refused, unreachable, DNS, connect timeout) or its TLS handshake failed,
// which net/http completes before writing a byte of the request.
func neverSent(err error) bool {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return true
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) || errors.Is(err, syscall.ECONNREFUSED) {
		return true
	}
	var (
		rhe    tls.RecordHeaderError
		alert  tls.AlertError
		verify *tls.CertificateVerificationError
		unkCA  x509.UnknownAuthorityError
		host   x509.HostnameError
		invCrt x509.CertificateInvalidError
	)
	if errors.As(err, &rhe) || errors.As(err, &alert) || errors.As(err, &verify) ||
		errors.As(err, &unkCA) || errors.As(err, &host) || errors.As(err, &invCrt) {
		return true
	}
	// net/http's handshake timeout and its "closed while idle" (the
	// worker closed a keep-alive connection before reading anything more
	// from it) have no exported type.
	msg := err.Error()
	return strings.Contains(msg, "net/http: TLS handshake timeout") || strings.Contains(msg, "http: server closed idle connection")
}

func (p *Proxy) isRetryable(status int) bool {
	return status >= 0 && status < len(p.retryable) && p.retryable[status]
}

// reserveRetryToken caps retries in progress at RetryBudgetRatio of the
// requests in flight (at least RetryBudgetMin), so a sick pool sees at most
// a bounded amplification instead of a retry storm. The check and the
// reservation are one atomic step: in a storm many requests fail at once,
// and checking before taking would let all of them through.
func (p *Proxy) reserveRetryToken() bool {
	limit := int64(math.Floor(p.o.RetryBudgetRatio * float64(p.active.Load())))
	if limit < int64(p.o.RetryBudgetMin) {
		limit = int64(p.o.RetryBudgetMin)
	}
	for {
		n := p.retryTokens.Load()
		if n >= limit {
			return false
		}
		if p.retryTokens.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (p *Proxy) backoff(attempt int) time.Duration {
	b := float64(p.o.InitialBackoff) * math.Pow(p.o.BackoffMultiplier, float64(attempt-1))
	if max := float64(p.o.MaxBackoff); p.o.MaxBackoff > 0 && b > max {
		b = max
	}
	if p.o.JitterFactor > 0 {
		p.rngMu.Lock()
		j := (p.rng.Float64()*2 - 1) * p.o.JitterFactor
		p.rngMu.Unlock()
		b *= 1 + j
	}
	return time.Duration(b)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

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
	resp, err := p.o.Tracer.RoundTrip(p.upstream, req, d.Worker, c.attempts)
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
const charsPerToken = 4

func (p *Proxy) workerURL(w string) (*url.URL, error) {
	if v, ok := p.workerURLs.Load(w); ok {
		return v.(*url.URL), nil
	}
	u, err := url.Parse(w)
	if err != nil {
		return nil, fmt.Errorf("worker url %q: %w", w, err)
	}
	p.workerURLs.Store(w, u)
	return u, nil
}

func singleJoin(base, path string) string {
	switch {
	case base == "" || base == "/":
		return path
	case base[len(base)-1] == '/' && len(path) > 0 && path[0] == '/':
		return base + path[1:]
	case base[len(base)-1] != '/' && (len(path) == 0 || path[0] != '/'):
		return base + "/" + path
	}
	return base + path
}

func requestID(r *http.Request) string {
	if id := r.Header.Get(HeaderRequestID); id != "" && len(id) <= 128 {
		return id
	}
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// maxLoggedString bounds a client-chosen string in a log line: a 60 KB
// model name must not become a 60 KB line (log volume, and ingestion
// pipelines that drop or split long lines).
const maxLoggedString = 256

// clip shortens s for a log line, saying how much was cut.
func clip(s string) string {
	if len(s) <= maxLoggedString {
		return s
	}
	n := maxLoggedString
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return fmt.Sprintf("%s...[%d bytes truncated]", s[:n], len(s)-n)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
