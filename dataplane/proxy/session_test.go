package proxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/dataplane/router"
)

// Requests carrying the same session key stick to one replica even when
// their prompts share nothing; the key is looked up in configured order.
func TestSessionKeysInConfiguredOrder(t *testing.T) {
	a, b, c := newBackend(t, "a"), newBackend(t, "b"), newBackend(t, "c")
	r := newRig(t, []string{a.URL, b.URL, c.URL}, func(o *proxy.Options, p *engine.Policy, _ []engine.WorkerSpec) {
		o.AddRoutedPeerHeader = true
		o.SessionKeys = []string{"header:X-Session-Id", "prompt_cache_key", "user"}
		p.SessionTTL = int64(time.Minute)
	})
	peerOf := func(body string, hdr ...string) string {
		resp := r.post("/v1/chat/completions", body, hdr...)
		readAll(t, resp)
		return resp.Header.Get("X-Routed-Peer")
	}
	withField := func(field, value string, i int) string {
		b, _ := json.Marshal(map[string]any{"model": "m", field: value,
			"messages": []map[string]string{{"role": "user", "content": fmt.Sprintf("unrelated prompt %d %s", i, longText(fmt.Sprint(i), 300))}}})
		return string(b)
	}
	for _, tc := range []struct {
		name string
		send func(i int) string
	}{
		{"header", func(i int) string {
			return peerOf(chatBody("s", fmt.Sprintf("q%d %s", i, longText(fmt.Sprint(i), 300)), false), "X-Session-Id", "sess-h")
		}},
		{"prompt_cache_key", func(i int) string { return peerOf(withField("prompt_cache_key", "sess-p", i)) }},
		{"user", func(i int) string { return peerOf(withField("user", "sess-u", i)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first := tc.send(0)
			for i := 1; i < 8; i++ {
				if got := tc.send(i); got != first {
					t.Fatalf("request %d of the session went to %s, first to %s", i, got, first)
				}
			}
		})
	}
	if v := counterValue(t, r, "cart_routing_decisions_total", `reason="session_hit"`); v != 21 {
		t.Fatalf("session_hit decisions = %v, want 21", v)
	}
	// The header wins over the body fields: a request with header sess-h
	// and user sess-u follows sess-h's replica.
	hPeer := peerOf(chatBody("s", "x", false), "X-Session-Id", "sess-h")
	if got := peerOf(withField("user", "sess-u", 99), "X-Session-Id", "sess-h"); got != hPeer {
		t.Fatalf("header key not preferred: %s vs %s", got, hPeer)
	}
	r.waitLoadZero()
}

// Without session keys configured, the same key does not pin requests.
func TestSessionKeysOff(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	r := newRig(t, []string{a.URL, b.URL})
	for i := range 6 {
		readAll(t, r.post("/v1/chat/completions", chatBody("s", fmt.Sprintf("q%d %s", i, longText(fmt.Sprint(i), 300)), false), "X-Session-Id", "s"))
	}
	if v := counterValue(t, r, "cart_routing_decisions_total", `reason="session_hit"`); v != 0 {
		t.Fatalf("session_hit with sessions off: %v", v)
	}
}

// /workers shows how right the index was: predicted vs reported cached
// tokens per worker, once workers report usage.
func TestWorkersShowPredictionAccuracy(t *testing.T) {
	a := newBackend(t, "a")
	a.set(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[],"usage":{"prompt_tokens":500,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":400}}}`)
	})
	r := newRig(t, []string{a.URL})
	body := chatBody(longText("sys", 2000), "q", false)
	readAll(t, r.post("/v1/chat/completions", body))
	readAll(t, r.post("/v1/chat/completions", body))
	r.waitLoadZero()
	resp, err := http.Get(r.front.URL + "/workers")
	if err != nil {
		t.Fatal(err)
	}
	var ws struct{ Workers []proxy.WorkerView }
	if err := json.NewDecoder(resp.Body).Decode(&ws); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	w := ws.Workers[0]
	// First request: nothing predicted; second: the whole prompt
	// predicted (500 tokens), 400 reported.
	if w.ActualCachedTokens != 800 || w.PredictedCachedTokens != 500 || w.PredictionAccuracy == nil || *w.PredictionAccuracy != 1.6 {
		t.Fatalf("accuracy view %+v", w)
	}
}

// sessionRecorder records the session keys the proxy hands its router.
type sessionRecorder struct {
	router.Router
	mu   sync.Mutex
	keys []string
}

func (s *sessionRecorder) Decide(ctx context.Context, req *router.Request) (router.Decision, error) {
	s.mu.Lock()
	s.keys = append(s.keys, req.Session)
	s.mu.Unlock()
	return s.Router.Decide(ctx, req)
}

// A client-chosen session key of any size reaches the router (and, in a
// data plane, the control plane) as a fixed-size hash, and one key still
// maps to one session.
func TestSessionKeyHashedBeforeRouting(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	var rec *sessionRecorder
	r := newWiredRig(t, []string{a.URL, b.URL}, wrapped(func(inner router.Router) router.Router { rec = &sessionRecorder{Router: inner}; return rec }),
		func(o *proxy.Options, p *engine.Policy, _ []engine.WorkerSpec) {
			o.SessionKeys = []string{"user"}
			o.MaxBodyBytes = 4 << 20
			p.SessionTTL = int64(time.Minute)
		})
	huge := strings.Repeat("u", 1<<20)
	for i := range 3 {
		body, _ := json.Marshal(map[string]any{"model": "m", "user": huge,
			"messages": []map[string]string{{"role": "user", "content": fmt.Sprintf("prompt %d", i)}}})
		resp, err := http.Post(r.front.URL+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, k := range rec.keys {
		if len(k) != 32 || k != rec.keys[0] {
			t.Fatalf("session keys sent to the router: %d bytes, first %d bytes; want one 32-byte hash", len(k), len(rec.keys[0]))
		}
	}
	r.waitLoadZero()
}
