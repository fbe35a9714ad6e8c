package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"

	"github.com/cartrouter/cart/sim"
)

// ScenarioPrecise is the reference router: it asks every replica what it
// has cached right now (cart-sim's POST /sim/match) and routes by that
// truth, with the same threshold and balance rule as CART. It stands in
// for a precise, engine-event-fed router — the "oracle" that an
// approximate index is measured against. It costs one fan-out round trip
// per request, which it does not hide.
const ScenarioPrecise = "precise"

// preciseRouter is the reference router's HTTP handler.
type preciseRouter struct {
	replicas []*url.URL
	client   *http.Client
	rp       *httputil.ReverseProxy

	threshold  float64
	balanceAbs int
	balanceRel float64
	mu         sync.Mutex
	inflight   map[string]int
	rng        *rand.Rand
}

type preciseTarget struct{} // context key of the chosen replica

func newPreciseRouter(replicas []string) (*preciseRouter, error) {
	p := &preciseRouter{
		client:     &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}},
		threshold:  0.3,
		balanceAbs: 64,
		balanceRel: 1.5,
		inflight:   map[string]int{},
		rng:        rand.New(rand.NewPCG(1, 2)),
	}
	for _, r := range replicas {
		u, err := url.Parse(r)
		if err != nil {
			return nil, err
		}
		p.replicas = append(p.replicas, u)
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(pr.In.Context().Value(preciseTarget{}).(*url.URL))
		},
		Transport: &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true},
	}
	return p, nil
}

func (p *preciseRouter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	target := p.choose(r.Context(), body)
	p.mu.Lock()
	p.inflight[target.Host]++
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.inflight[target.Host]--
		p.mu.Unlock()
	}()
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	p.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), preciseTarget{}, target)))
}

// choose applies CART's rules to the replicas' real cache contents.
func (p *preciseRouter) choose(ctx context.Context, body []byte) *url.URL {
	reports := make([]sim.MatchReport, len(p.replicas))
	var wg sync.WaitGroup
	for i, u := range p.replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String()+"/sim/match", bytes.NewReader(body))
			if err != nil {
				return
			}
			resp, err := p.client.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			_ = json.NewDecoder(resp.Body).Decode(&reports[i])
		}()
	}
	wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	least, cand := -1, -1
	ties := 0
	for i, u := range p.replicas {
		l := p.inflight[u.Host]
		switch {
		case least < 0 || l < p.inflight[p.replicas[least].Host]:
			least, ties = i, 1
		case l == p.inflight[p.replicas[least].Host]:
			ties++
			if p.rng.IntN(ties) == 0 {
				least = i
			}
		}
		if reports[i].CachedTokens > 0 && (cand < 0 || reports[i].CachedTokens > reports[cand].CachedTokens ||
			(reports[i].CachedTokens == reports[cand].CachedTokens && l < p.inflight[p.replicas[cand].Host])) {
			cand = i
		}
	}
	if cand < 0 || reports[cand].PromptTokens == 0 ||
		float64(reports[cand].CachedTokens)/float64(reports[cand].PromptTokens) < p.threshold {
		return p.replicas[least]
	}
	lc, ll := p.inflight[p.replicas[cand].Host], p.inflight[p.replicas[least].Host]
	if lc-ll > p.balanceAbs && float64(lc) > float64(ll)*p.balanceRel {
		return p.replicas[least]
	}
	return p.replicas[cand]
}

// startPrecise serves the reference router on a free port in this process
// and returns its URL and a stop function.
func (s *suite) startPrecise() (string, func(), error) {
	port, err := s.env.FreePort()
	if err != nil {
		return "", nil, err
	}
	h, err := newPreciseRouter(s.replicaURLs())
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", hostPort(port))
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return baseURL(port), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}
