package proxy

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
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
	"github.com/prometheus/client_golang/prometheus"
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
	// request (0 = no bound). See budget.go and extract.Options.MaxItems.
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
	// Flow says how a request's tenant, priority and deadline are read
	// for flow control (admission.go).
	Flow FlowPolicy
	// Disagg says how requests split between a prefill and a decode
	// worker are run (pd.go).
	Disagg     DisaggOptions
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
	upstream  http.RoundTripper
	retryable [600]bool
	mux       *http.ServeMux
	log       *slog.Logger
	m         *metrics.Metrics

	active      atomic.Int64 // requests being proxied (retry budget base)
	retryTokens atomic.Int64 // retry attempts in progress

	workers sync.Map // worker URL string -> *workerInfo

	rngMu sync.Mutex
	rng   *mrand.Rand

	models   modelsCache
	affinity *affinity.Table[string]

	auth                  clientAuth
	workerKeys            workerKeys
	passPaths, retryPaths pathSet
	budget                *bodyBudget // nil: no bound

	// Metric children looked up once rather than per request.
	predictedFraction, actualFraction prometheus.Observer
	decisions                         sync.Map // reason -> prometheus.Counter
	pd                                pdChildren
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
	if o.MaxItems > 0 {
		// Counted in the walk extract makes before decoding anything.
		o.Extract.MaxItems = o.MaxItems
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
		p.upstream = newH1Transport(o.ConnectTimeout, o.RequestTimeout, NewTransport(o.ConnectTimeout, o.RequestTimeout))
	}
	p.predictedFraction = p.m.CachedFraction.WithLabelValues("predicted")
	p.pd = newPDChildren(p.m)
	p.actualFraction = p.m.CachedFraction.WithLabelValues("actual")
	p.models.ttl = o.ModelsCacheTTL
	p.affinity = affinity.New[string](o.ResponseAffinityTTL, o.ResponseAffinityMax)
	p.passPaths, p.retryPaths = newPathSet(o.PassThroughPaths), newPathSet(o.RetryablePassThroughPaths)
	if o.MaxInflightBodyBytes > 0 {
		p.budget = &bodyBudget{limit: o.MaxInflightBodyBytes}
	}
	mux := http.NewServeMux()
	for _, ep := range extract.Endpoints() {
		mux.HandleFunc("POST "+ep.Path(), p.routed(ep))
	}
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

// workerInfo is what every attempt on a worker needs: its parsed URL and
// its metric children, looked up once instead of hashing the label on
// every request.
type workerInfo struct {
	url                                         *url.URL
	inFlight                                    prometheus.Gauge
	ttfb                                        prometheus.Observer
	promptTokens, cachedTokens, predictedCached prometheus.Counter
}

// decisionCounter is cart_routing_decisions_total's child for reason.
func (p *Proxy) decisionCounter(reason string) prometheus.Counter {
	if v, ok := p.decisions.Load(reason); ok {
		return v.(prometheus.Counter)
	}
	v, _ := p.decisions.LoadOrStore(reason, p.m.Decisions.WithLabelValues(reason))
	return v.(prometheus.Counter)
}

func (p *Proxy) worker(w string) (*workerInfo, error) {
	if v, ok := p.workers.Load(w); ok {
		return v.(*workerInfo), nil
	}
	u, err := url.Parse(w)
	if err != nil {
		return nil, fmt.Errorf("worker url %q: %w", w, err)
	}
	wi := &workerInfo{
		url:             u,
		inFlight:        p.m.InFlight.WithLabelValues(w),
		ttfb:            p.m.UpstreamTTFB.WithLabelValues(w),
		promptTokens:    p.m.PromptTokens.WithLabelValues(w),
		cachedTokens:    p.m.CachedTokens.WithLabelValues(w),
		predictedCached: p.m.PredictedCached.WithLabelValues(w),
	}
	v, _ := p.workers.LoadOrStore(w, wi)
	return v.(*workerInfo), nil
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

// newCall starts the record of one client request. Its id is CART's own,
// always: it is what the worker receives as X-Request-Id and what every
// log line of the request carries, so a client must not choose it (to
// collide with another tenant's requests in the logs, or to inject text
// into them). The client's own X-Request-Id is kept, sanitized, for the
// logs only.
func (p *Proxy) newCall(r *http.Request, endpoint, tenant string) *call {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return &call{id: hex.EncodeToString(b[:]), clientID: clientRequestID(r), endpoint: endpoint, tenant: tenant,
		anthropic: apierr.IsAnthropicPath(r.URL.Path), start: p.o.Now()}
}

// maxClientRequestID bounds the client's X-Request-Id as logged.
const maxClientRequestID = 128

// clientRequestID is the client's X-Request-Id for the logs: printable
// ASCII only (anything else, a line break included, becomes '?'), at most
// maxClientRequestID bytes, "" when the client sent none.
func clientRequestID(r *http.Request) string {
	v := r.Header.Get(HeaderRequestID)
	if v == "" {
		return ""
	}
	n := min(len(v), maxClientRequestID)
	clean := true
	for i := range n {
		if v[i] < 0x20 || v[i] > 0x7e {
			clean = false
			break
		}
	}
	if clean {
		return v[:n]
	}
	b := []byte(v[:n])
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			b[i] = '?'
		}
	}
	return string(b)
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
