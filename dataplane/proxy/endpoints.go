package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/cartrouter/cart/controlplane/models"
	"github.com/cartrouter/cart/dataplane/apierr"
	"github.com/cartrouter/cart/dataplane/extract"
	"github.com/cartrouter/cart/dataplane/router"
)

func (p *Proxy) handleHealth(w http.ResponseWriter, _ *http.Request) {
	ws := p.o.Router.Workers()
	healthy := 0
	for _, wk := range ws {
		if wk.Healthy {
			healthy++
		}
	}
	status, code := "ok", http.StatusOK
	if healthy == 0 {
		status, code = "unavailable", http.StatusServiceUnavailable
	}
	writeJSON(w, code, map[string]any{"status": status, "healthy_workers": healthy, "workers": len(ws)})
}

// WorkerView is one row of GET /workers.
type WorkerView struct {
	URL     string `json:"url"`
	Load    int    `json:"load"`
	MaxLoad int    `json:"max_load"`
	// ConcurrencyLimit is the worker's concurrency in force (declared
	// max_concurrency, or learned from its engine's metrics; 0 unknown):
	// with max_load, what makes it saturated for flow control.
	ConcurrencyLimit int    `json:"concurrency_limit"`
	LoadPenalty      int    `json:"load_penalty"`
	Healthy          bool   `json:"healthy"`
	BreakerState     string `json:"breaker_state"`
	// How right the prefix index has been about this worker's cache:
	// cached prompt tokens it predicted vs what the worker reported.
	PredictedCachedTokens uint64   `json:"predicted_cached_tokens"`
	ActualCachedTokens    uint64   `json:"actual_cached_tokens"`
	PredictionAccuracy    *float64 `json:"prediction_accuracy"` // actual/predicted; null until a report with cache fields predicted a hit
	CacheMisses           uint64   `json:"cache_misses"`
	ModelCapacityBlocks   int      `json:"model_capacity_blocks"`
	// Source is where the worker came from: static, admin, dns or
	// kubernetes (state.Source*).
	Source string `json:"source"`
	// Draining: left its discovery source; no new requests, in-flight finish.
	Draining bool `json:"draining"`
	// Role is the part of requests it serves: both, prefill or decode.
	Role string `json:"role"`
	// Models the worker serves (declared and probed); empty while unknown,
	// and a worker whose list is unknown gets no request for a model some
	// other worker is known to serve.
	Models []string `json:"models"`
	// KVEvents is the cache the worker's engine reports in its KV events,
	// while they drive its model; null otherwise (none configured, or
	// fallen back to the approximate index after a loss).
	KVEvents *KVEventsView `json:"kv_events"`
}

// KVEventsView is a worker's engine-reported prefix cache.
type KVEventsView struct {
	OccupiedTokens int64 `json:"occupied_tokens"`
	// CapacityTokens is the cache size as the events show it (peak
	// occupancy once the engine has evicted); 0 while it never has.
	CapacityTokens int64 `json:"capacity_tokens"`
}

func (p *Proxy) handleWorkers(w http.ResponseWriter, r *http.Request) {
	if !p.adminAllowed(w, r) {
		return
	}
	ws := p.o.Router.Workers()
	out := make([]WorkerView, len(ws))
	for i, wk := range ws {
		out[i] = WorkerView{URL: wk.URL, Load: wk.Load, MaxLoad: wk.MaxLoad, ConcurrencyLimit: wk.Concurrency, LoadPenalty: wk.LoadPenalty,
			Healthy: wk.Healthy, BreakerState: p.o.Breakers.StateAt(wk.URL, p.o.Now()).String(),
			PredictedCachedTokens: wk.PredictedCachedTokens, ActualCachedTokens: wk.ActualCachedTokens,
			CacheMisses: wk.CacheMisses, ModelCapacityBlocks: wk.ModelCapacityBlocks, Source: wk.Source, Draining: wk.Draining, Role: wk.Role.String(),
			Models: p.o.Models.IDs(wk.URL)}
		if out[i].Models == nil {
			out[i].Models = []string{}
		}
		if kv := wk.KVEvents; kv != nil {
			out[i].KVEvents = &KVEventsView{OccupiedTokens: kv.OccupiedTokens, CapacityTokens: kv.CapacityTokens}
		}
		if wk.PredictedCachedTokens > 0 {
			acc := float64(wk.ActualCachedTokens) / float64(wk.PredictedCachedTokens)
			out[i].PredictionAccuracy = &acc
		}
	}
	view := map[string]any{"workers": out}
	if q, ok := p.o.Router.(router.QueueReporter); ok {
		// The all-in-one router's own queue (a data plane's is the
		// leader's: cartctl queue).
		qs, pool := q.Queue(), q.PoolSaturation()
		view["queue"] = map[string]any{"waiting": len(qs.Items), "bytes": qs.Bytes, "slots": pool.Slots, "demand": pool.Demand}
	}
	writeJSON(w, http.StatusOK, view)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// modelsCache answers GET /v1/models from memory for ttl after one worker
// answered it. It keeps serving the last answer after every worker is gone:
// it says which models the pool serves, not whether the pool is up, so it
// is no liveness probe (use /health).
type modelsCache struct {
	ttl     time.Duration
	mu      sync.Mutex // held across the fetch on purpose: one fetch, not a herd
	body    []byte
	ctype   string
	fetched time.Time
}

func (p *Proxy) handleModels(w http.ResponseWriter, r *http.Request) {
	if _, ok := p.authenticate(w, r, "models"); !ok {
		return
	}
	if p.o.Models.Known() {
		// The pool's answer, from every healthy worker's list as the last
		// probe saw it: no single replica's view, and no cache to go stale.
		healthy := map[string]bool{}
		for _, wk := range p.o.Router.Workers() {
			healthy[wk.URL] = wk.Healthy
		}
		p.m.ModelsCache.WithLabelValues("pool").Inc()
		serveModels(w, "application/json", p.o.Models.List(func(u string) bool { return healthy[u] }), "pool")
		return
	}
	body, ctype, source, err := p.models.get(p, r.Context())
	if err != nil {
		p.log.Warn("could not list models", "error", err.Error())
		ae := upstreamError(err)
		var own *apierr.Error
		if !errors.As(err, &own) {
			ae.Message = "could not list models: " + ae.Message
		}
		apierr.Write(w, ae)
		return
	}
	// Written after the lock is released: a client that reads slowly must
	// not hold up everyone else's /v1/models.
	p.m.ModelsCache.WithLabelValues(source).Inc()
	serveModels(w, ctype, body, source)
}

// get returns the cached list, refreshing it when it is older than the
// TTL. The lock is held across the refresh on purpose (one fetch, not a
// herd), and the fetch runs detached from the first caller's context, so
// that caller hanging up does not fail it for the others.
func (mc *modelsCache) get(p *Proxy, ctx context.Context) (body []byte, ctype, source string, err error) {
	mc.mu.Lock()
	defer mc.mu.Unlock()
	now := p.o.Now()
	if mc.body != nil && now.Sub(mc.fetched) < mc.ttl {
		return mc.body, mc.ctype, "hit", nil
	}
	body, ctype, err = p.fetchModels(context.WithoutCancel(ctx))
	if err == nil {
		mc.body, mc.ctype, mc.fetched = body, ctype, now
		return body, ctype, "miss", nil
	}
	if mc.body != nil {
		p.log.Warn("serving stale /v1/models: no worker answered", "error", err.Error())
		return mc.body, mc.ctype, "stale", nil
	}
	return nil, "", "", err
}

func serveModels(w http.ResponseWriter, ctype string, body []byte, source string) {
	if ctype == "" {
		ctype = "application/json"
	}
	w.Header().Set("Content-Type", ctype)
	w.Header().Set("X-Cart-Models-Cache", source)
	_, _ = w.Write(body)
}

// fetchModels asks one usable worker (least loaded) for its model list,
// trying others if it fails.
func (p *Proxy) fetchModels(ctx context.Context) ([]byte, string, error) {
	timeout := p.o.RequestTimeout
	if timeout <= 0 || timeout > 10*time.Second {
		timeout = 10 * time.Second
	}
	var failed []string
	var lastErr error
	for range max(1, p.o.MaxRetries+1) {
		d, err := p.o.Router.Decide(ctx, &router.Request{Exclude: failed})
		if err != nil {
			if lastErr != nil {
				return nil, "", lastErr
			}
			return nil, "", apierr.New(http.StatusServiceUnavailable, apierr.TypeUnavailable, "no_worker_available", "%v", err)
		}
		body, ctype, err := p.getModels(ctx, d.Worker, d.Source, timeout)
		p.o.Router.Done(d, router.Outcome{Delivered: err == nil, PromptTokens: -1, CachedTokens: -1})
		if err == nil {
			return body, ctype, nil
		}
		lastErr = err
		failed = append(failed, d.Worker)
	}
	return nil, "", lastErr
}

func (p *Proxy) getModels(ctx context.Context, worker, source string, timeout time.Duration) ([]byte, string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, worker+models.Path, nil)
	if err != nil {
		return nil, "", fmt.Errorf("models request: %w", err)
	}
	p.setWorkerAuth(req.Header, worker, source)
	resp, err := p.upstream.RoundTrip(req)
	if err != nil {
		return nil, "", fmt.Errorf("models from %s: %w", worker, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, "", fmt.Errorf("models from %s: %w", worker, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, "", fmt.Errorf("models from %s: status %d", worker, resp.StatusCode)
	}
	return body, resp.Header.Get("Content-Type"), nil
}

// passThrough forwards requests for paths CART does not route by prefix,
// but only those on the allowlist (Options.PassThroughPaths): the engines
// behind CART also serve admin endpoints (SGLang's /flush_cache and
// /update_weights_from_disk, vLLM's /reset_prefix_cache and
// /v1/load_lora_adapter, cart-sim's /sim/fault) that no client of the
// pool may reach.
func (p *Proxy) passThrough(w http.ResponseWriter, r *http.Request) {
	tenant, ok := p.authenticate(w, r, "other")
	if !ok {
		return
	}
	// ServeMux matches escaped paths, so /v1/chat%2Fcompletions lands here
	// although the worker would decode it to a routed endpoint: route it
	// as one, so extraction and the remote-media policy are never skipped.
	if ep, ok := extract.EndpointForPath(r.URL.Path); ok && r.Method == http.MethodPost {
		p.serveRouted(ep, w, r, tenant)
		return
	}
	c := p.newCall(r, "other", tenant)
	if !p.passPaths.allows(r.URL.Path) {
		p.fail(w, c, apierr.New(http.StatusNotFound, apierr.TypeInvalidRequest, "unknown_url",
			"Unknown request URL: %s %s. This router forwards only the paths listed in proxy.pass_through_paths.", r.Method, truncate(r.URL.Path, 200)))
		return
	}
	defer c.hold.free()
	body, err := p.readBody(w, r, c)
	if err != nil {
		p.fail(w, c, err)
		return
	}
	if p.o.RemoteMediaPolicy != 0 {
		// The engines parse these bodies too (messages in /v1/embeddings
		// and /tokenize, input_image in /v1/responses, image_data in
		// SGLang's /generate): the policy applies to every one of them.
		m, err := extract.ScanMedia(body)
		if err == nil {
			err = p.mediaRefusal(m)
		}
		if err != nil {
			p.fail(w, c, err)
			return
		}
	}
	// Engines refuse a model they do not serve on these APIs too.
	if err := p.filterModel(c, passThroughModel(r, body)); err != nil {
		p.fail(w, c, err)
		return
	}
	c.body = body
	c.noResend = !p.resendable(r)
	p.forward(w, r, c)
}

// mediaRefusal applies proxy.remote_media_url_policy to what a body's media
// fields hold.
func (p *Proxy) mediaRefusal(m extract.Media) error {
	if p.o.RemoteMediaPolicy == 0 {
		return nil
	}
	u := m.Remote
	if u == "" && !p.o.AllowFileMediaURLs {
		u = m.File
	}
	if u == "" {
		return nil
	}
	return apierr.New(p.o.RemoteMediaPolicy, apierr.TypeInvalidRequest, "remote_media_refused",
		"remote media URLs are not accepted by this router (found %q); send the media inline as a data: URL or base64 block", truncate(u, 200))
}

// resendable reports whether a pass-through request may be sent again to
// another worker after one may have received it: inference calls and
// reads, yes; anything else (an operator-allowed path with side effects)
// must not run twice.
func (p *Proxy) resendable(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return true
	}
	return p.retryPaths.allows(r.URL.Path)
}

// mayResend reports whether the attempt that failed with err may be
// repeated on another worker. A request that never left (the connection
// was refused or could not be set up) always may.
func (c *call) mayResend(err error) bool {
	if !c.noResend {
		return true
	}
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// pathSet matches request paths against allowlist entries: exact paths, and
// "/prefix/*" for every path under /prefix/.
type pathSet struct {
	exact    map[string]bool
	prefixes []string
}

func newPathSet(entries []string) pathSet {
	s := pathSet{exact: map[string]bool{}}
	for _, e := range entries {
		if pre, ok := strings.CutSuffix(e, "/*"); ok {
			s.prefixes = append(s.prefixes, pre+"/")
			continue
		}
		s.exact[e] = true
	}
	return s
}

// allows reports whether p is on the list. Only clean paths match: a
// worker that resolved "/v1/embeddings/../../sim/fault" itself would be
// reached through an allowed prefix otherwise.
func (s pathSet) allows(p string) bool {
	if p == "" || path.Clean(p) != p {
		return false
	}
	if s.exact[p] {
		return true
	}
	for _, pre := range s.prefixes {
		if strings.HasPrefix(p, pre) {
			return true
		}
	}
	return false
}
