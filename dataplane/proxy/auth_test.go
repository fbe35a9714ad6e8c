package proxy_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/internal/testkit"
)

// headerLog records the credential headers each backend request carried.
type headerLog struct {
	mu   sync.Mutex
	seen []http.Header
}

func (h *headerLog) record(r *http.Request) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seen = append(h.seen, http.Header{
		"Authorization": r.Header.Values("Authorization"),
		"X-Api-Key":     r.Header.Values("X-Api-Key"),
		"Path":          {r.URL.Path},
	})
}

func (h *headerLog) all() []http.Header {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]http.Header(nil), h.seen...)
}

func withClientKeys(keys ...proxy.ClientKey) rigOpt {
	return withOptions(func(o *proxy.Options) { o.ClientKeys = keys })
}

var teamKeys = []proxy.ClientKey{{Name: "team-a", Key: "key-a-0123456789"}, {Name: "team-b", Key: "key-b-0123456789"}}

func do(t *testing.T, method, url, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	resp, b, err := testkit.Do(t, method, url, body, hdr...)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// TestClientKeyRequiredOnEveryProxiedPath: with client keys configured, no
// proxied path reaches a worker without a valid key, and the refusal is a
// 401 with WWW-Authenticate in the endpoint's error shape.
func TestClientKeyRequiredOnEveryProxiedPath(t *testing.T) {
	b := newBackend(t, "a")
	var hl headerLog
	b.set(func(w http.ResponseWriter, r *http.Request) {
		hl.record(r)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"m"}]}`))
	})
	r := newRig(t, []string{b.URL}, withClientKeys(teamKeys...))
	chat := chatBody("sys", "hi", false)
	paths := []struct {
		method, path, body string
		anthropic          bool
	}{
		{"POST", "/v1/chat/completions", chat, false},
		{"POST", "/v1/completions", `{"model":"m","prompt":"hi"}`, false},
		{"POST", "/v1/messages", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`, true},
		{"POST", "/v1/messages/count_tokens", `{"model":"m","messages":[]}`, true},
		{"GET", "/v1/models", "", false},
		{"POST", "/v1/embeddings", `{"model":"m","input":"hi"}`, false},
		{"POST", "/v1/chat%2Fcompletions", chat, false},
	}
	creds := []struct {
		name string
		hdr  []string
		msg  string
	}{
		{"none", nil, "missing API key"},
		{"wrong bearer", []string{"Authorization", "Bearer nope"}, "invalid API key"},
		{"wrong x-api-key", []string{"X-Api-Key", "nope"}, "invalid API key"},
		{"other scheme", []string{"Authorization", "Basic " + teamKeys[0].Key}, "missing API key"},
		{"key as bare header value", []string{"Authorization", teamKeys[0].Key}, "missing API key"},
	}
	for _, p := range paths {
		for _, c := range creds {
			resp, body := do(t, p.method, r.front.URL+p.path, p.body, c.hdr...)
			if resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("%s %s with %s: status %d, want 401 (%s)", p.method, p.path, c.name, resp.StatusCode, body)
			}
			if got := resp.Header.Get("WWW-Authenticate"); got != `Bearer realm="cart"` {
				t.Errorf("%s %s: WWW-Authenticate = %q", p.method, p.path, got)
			}
			var oa struct {
				Type  string `json:"type"`
				Error struct {
					Type    string `json:"type"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(body), &oa); err != nil {
				t.Fatalf("%s: body %q: %v", p.path, body, err)
			}
			if oa.Error.Type != "authentication_error" || !strings.Contains(oa.Error.Message, c.msg) {
				t.Errorf("%s %s with %s: error %+v, want authentication_error %q", p.method, p.path, c.name, oa.Error, c.msg)
			}
			if p.anthropic != (oa.Type == "error") {
				t.Errorf("%s: body %s, anthropic shape expected: %v", p.path, body, p.anthropic)
			}
		}
	}
	if n := b.hits.Load(); n != 0 {
		t.Fatalf("%d unauthenticated requests reached the worker", n)
	}
	// Health probes stay open: load balancers carry no keys.
	if resp, _ := do(t, "GET", r.front.URL+"/health", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("/health: %d", resp.StatusCode)
	}

	good := [][]string{
		{"Authorization", "Bearer " + teamKeys[0].Key},
		{"Authorization", "bearer " + teamKeys[1].Key},
		{"Authorization", "BEARER  " + teamKeys[0].Key},
		{"X-Api-Key", teamKeys[1].Key},
	}
	for _, p := range paths {
		for _, h := range good {
			resp, body := do(t, p.method, r.front.URL+p.path, p.body, h...)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s %s with %v: status %d (%s)", p.method, p.path, h, resp.StatusCode, body)
			}
		}
	}
	for _, h := range hl.all() {
		if len(h["Authorization"]) != 0 || len(h["X-Api-Key"]) != 0 {
			t.Fatalf("client credentials forwarded to the worker on %s: %v", h["Path"], h)
		}
	}
}

// TestAnthropicErrorShapeOnMessages: every error of /v1/messages, not only
// 401, is in the shape the Anthropic SDKs parse.
func TestAnthropicErrorShapeOnMessages(t *testing.T) {
	b := newBackend(t, "a")
	r := newRig(t, []string{b.URL}, withOptions(func(o *proxy.Options) { o.MaxBodyBytes = 2048 }))
	for _, tt := range []struct {
		body     string
		status   int
		wantType string
	}{
		{`{"model":`, http.StatusBadRequest, "invalid_request_error"},
		{`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 4096) + `"}]}`, http.StatusRequestEntityTooLarge, "request_too_large"},
	} {
		resp, body := do(t, "POST", r.front.URL+"/v1/messages", tt.body)
		var e struct {
			Type  string `json:"type"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(body), &e); err != nil || resp.StatusCode != tt.status || e.Type != "error" || e.Error.Type != tt.wantType || e.Error.Message == "" {
			t.Errorf("status %d body %s (%v); want %d, Anthropic %s", resp.StatusCode, body, err, tt.status, tt.wantType)
		}
	}
	// The OpenAI endpoints keep the OpenAI shape.
	resp, body := do(t, "POST", r.front.URL+"/v1/chat/completions", `{"model":`)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, `"type":"invalid_request_error"`) || strings.Contains(body, `"type":"error"`) {
		t.Errorf("chat error: %d %s", resp.StatusCode, body)
	}
}

// TestWorkerKeysReplaceClientCredentials: each worker gets its own key (or
// the pool default), on proxied requests and on the models fetch, and never
// the client's.
func TestWorkerKeysReplaceClientCredentials(t *testing.T) {
	var logs [2]headerLog
	bs := []*backend{newBackend(t, "a"), newBackend(t, "b")}
	for i, b := range bs {
		hl := &logs[i]
		b.set(func(w http.ResponseWriter, r *http.Request) {
			hl.record(r)
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"object":"list","data":[]}`))
		})
	}
	r := newRig(t, []string{bs[0].URL, bs[1].URL}, withClientKeys(teamKeys...), withOptions(func(o *proxy.Options) {
		o.WorkerKeys = proxy.WorkerKeys{PerWorker: map[string]string{bs[0].URL: "worker-a-key"}, Default: "pool-key", DefaultSources: []string{"static"}}
	}))
	for i := 0; i < 8; i++ {
		// Different prompts spread over both workers (least loaded on a miss).
		resp, body := do(t, "POST", r.front.URL+"/v1/chat/completions", chatBody(longText("s", 200+i), "u", false),
			"Authorization", "Bearer "+teamKeys[0].Key, "X-Api-Key", teamKeys[0].Key)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
	}
	if resp, body := do(t, "GET", r.front.URL+"/v1/models", "", "X-Api-Key", teamKeys[1].Key); resp.StatusCode != http.StatusOK {
		t.Fatalf("models: %d %s", resp.StatusCode, body)
	}
	want := []string{"Bearer worker-a-key", "Bearer pool-key"}
	total := 0
	for i := range logs {
		for _, h := range logs[i].all() {
			total++
			if got := h["Authorization"]; len(got) != 1 || got[0] != want[i] {
				t.Errorf("worker %d got Authorization %v on %s, want %q", i, got, h["Path"], want[i])
			}
			if len(h["X-Api-Key"]) != 0 {
				t.Errorf("worker %d got the client's x-api-key", i)
			}
		}
	}
	if total != 9 || len(logs[0].all()) == 0 || len(logs[1].all()) == 0 {
		t.Fatalf("requests per worker: %d, %d; want both used, 9 in all", len(logs[0].all()), len(logs[1].all()))
	}
}

// Attack #3 of issue 33, the key's side: a worker discovery found gets
// the pool's worker key neither on requests nor on the models fetch unless
// its source is listed (proxy.worker_api_key_sources); its own key, when
// the operator configured one for its URL, it does get.
func TestPoolKeyOnlyForTrustedSources(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sources []string
		own     bool
		want    string
	}{
		{"discovered, not trusted", []string{"static", "admin"}, false, ""},
		{"discovered, dns trusted", []string{"static", "dns"}, false, "Bearer pool-key"},
		{"discovered, its own key", []string{"static"}, true, "Bearer own-key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var log headerLog
			b := newBackend(t, "d")
			b.set(func(w http.ResponseWriter, r *http.Request) {
				log.record(r)
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`{"object":"list","data":[]}`))
			})
			keys := proxy.WorkerKeys{Default: "pool-key", DefaultSources: tc.sources}
			if tc.own {
				keys.PerWorker = map[string]string{b.URL: "own-key"}
			}
			r := newRig(t, []string{b.URL}, func(o *proxy.Options, _ *engine.Policy, s []engine.WorkerSpec) {
				s[0].Source = "dns"
				o.WorkerKeys = keys
			})
			if resp, body := do(t, "POST", r.front.URL+"/v1/chat/completions", chatBody("s", "u", false)); resp.StatusCode != http.StatusOK {
				t.Fatalf("chat: %d %s", resp.StatusCode, body)
			}
			if resp, body := do(t, "GET", r.front.URL+"/v1/models", ""); resp.StatusCode != http.StatusOK {
				t.Fatalf("models: %d %s", resp.StatusCode, body)
			}
			got := log.all()
			if len(got) != 2 {
				t.Fatalf("worker saw %d requests, want the chat and the models fetch", len(got))
			}
			for _, h := range got {
				if a := strings.Join(h["Authorization"], ","); a != tc.want {
					t.Errorf("%s carried Authorization %q, want %q", h["Path"], a, tc.want)
				}
			}
		})
	}
}

// TestTenantLabelsLogsAndMetrics: the tenant is a bounded label: the
// configured names, and "anonymous" for refusals.
func TestTenantLabelsLogsAndMetrics(t *testing.T) {
	b := newBackend(t, "a")
	var buf testkit.SyncBuffer
	r := newRig(t, []string{b.URL}, withClientKeys(teamKeys...), logsTo(&buf))
	for _, k := range []string{teamKeys[1].Key, teamKeys[1].Key, "attacker-chosen-" + strings.Repeat("x", 40)} {
		resp, _ := do(t, "POST", r.front.URL+"/v1/chat/completions", chatBody("sys", "hi", false), "X-Api-Key", k)
		_ = resp
	}
	r.waitLoadZero()
	if v := counterValue(t, r, "cart_requests_total", `status="2xx",tenant="team-b"`); v != 2 {
		t.Errorf("cart_requests_total{tenant=team-b,2xx} = %v, want 2", v)
	}
	if v := counterValue(t, r, "cart_requests_total", `status="4xx",tenant="anonymous"`); v != 1 {
		t.Errorf("cart_requests_total{tenant=anonymous,4xx} = %v, want 1", v)
	}
	logs := buf.String()
	if !strings.Contains(logs, `"msg":"route"`) || !strings.Contains(logs, `"tenant":"team-b"`) {
		t.Errorf("route log line lacks the tenant:\n%s", logs)
	}
	if strings.Contains(logs, "attacker-chosen") || strings.Contains(logs, teamKeys[1].Key) {
		t.Errorf("a presented key reached the log:\n%s", logs)
	}
}

// TestWorkersNeedsAdminToken: /workers lists internal URLs, so it takes
// the admin token; a client key is not enough.
func TestWorkersNeedsAdminToken(t *testing.T) {
	b := newBackend(t, "a")
	r := newRig(t, []string{b.URL}, withClientKeys(teamKeys...), withOptions(func(o *proxy.Options) {
		o.AdminToken = "admin-0123456789"
	}))
	for _, h := range [][]string{nil, {"Authorization", "Bearer " + teamKeys[0].Key}, {"X-Api-Key", "admin-0123456789"}, {"Authorization", "Bearer wrong"}} {
		resp, body := do(t, "GET", r.front.URL+"/workers", "", h...)
		if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" || strings.Contains(body, b.URL) {
			t.Errorf("/workers with %v: %d %s", h, resp.StatusCode, body)
		}
	}
	resp, body := do(t, "GET", r.front.URL+"/workers", "", "Authorization", "Bearer admin-0123456789")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, b.URL) {
		t.Errorf("/workers with the admin token: %d %s", resp.StatusCode, body)
	}
	// The admin token is not a client key either.
	if resp, _ := do(t, "POST", r.front.URL+"/v1/chat/completions", chatBody("s", "u", false), "Authorization", "Bearer admin-0123456789"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("admin token accepted as a client key: %d", resp.StatusCode)
	}
}

// TestWorkersLoopbackOnlyWithoutAdminToken: with no admin token, only a
// caller on the same host sees /workers.
func TestWorkersLoopbackOnlyWithoutAdminToken(t *testing.T) {
	b := newBackend(t, "a")
	r := newRig(t, []string{b.URL})
	if resp, _ := do(t, "GET", r.front.URL+"/workers", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("loopback /workers: %d", resp.StatusCode)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/workers", nil)
	req.RemoteAddr = "10.1.2.3:40000"
	r.proxy.ServeHTTP(rec, req)
	if rec.Code != http.StatusForbidden || strings.Contains(rec.Body.String(), b.URL) {
		t.Fatalf("remote /workers without admin token: %d %s", rec.Code, rec.Body)
	}
}

// TestMetricsElsewhere: when /metrics has its own listener the client
// listener neither serves it nor passes it through to a worker.
func TestMetricsElsewhere(t *testing.T) {
	b := newBackend(t, "a")
	r := newRig(t, []string{b.URL}, withOptions(func(o *proxy.Options) { o.MetricsElsewhere = true }))
	resp, body := do(t, "GET", r.front.URL+"/metrics", "")
	if resp.StatusCode != http.StatusNotFound || strings.Contains(body, "cart_") || b.hits.Load() != 0 {
		t.Fatalf("/metrics: %d, worker hits %d, body %.80s", resp.StatusCode, b.hits.Load(), body)
	}
}
