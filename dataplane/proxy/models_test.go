package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/models"
	"github.com/cartrouter/cart/dataplane/proxy"
)

const modelList = `{"object":"list","data":[{"id":"m","object":"model"}]}`

// modelsBackend is a replica that answers GET /v1/models and counts it.
func modelsBackend(t *testing.T, name string, calls *atomic.Int64) *backend {
	b := newBackend(t, name)
	b.set(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/models" {
			http.NotFound(w, r)
			return
		}
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, modelList)
	})
	return b
}

func getModels(t *testing.T, r *rig) (status int, source, body string) {
	t.Helper()
	resp, err := http.Get(r.front.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	body = readAll(t, resp)
	return resp.StatusCode, resp.Header.Get("X-Cart-Models-Cache"), body
}

// GET /v1/models: the first call is proxied, later ones come from the
// cache without touching a replica, the TTL forces a refetch, and once
// every replica is gone the cached list is still served.
func TestModelsCache(t *testing.T) {
	var calls atomic.Int64
	a, b := modelsBackend(t, "a", &calls), modelsBackend(t, "b", &calls)
	var clock fakeClock
	w := defaultWiring()
	w.now = clock.now
	r := newWiredRig(t, []string{a.URL, b.URL}, w, withOptions(func(o *proxy.Options) { o.ModelsCacheTTL = 10 * time.Minute }))

	expect := func(step string, wantSource string, wantCalls int64) {
		t.Helper()
		status, source, body := getModels(t, r)
		if status != http.StatusOK || body != modelList {
			t.Fatalf("%s: status %d body %q", step, status, body)
		}
		if source != wantSource {
			t.Fatalf("%s: X-Cart-Models-Cache %q, want %q", step, source, wantSource)
		}
		if calls.Load() != wantCalls {
			t.Fatalf("%s: replicas asked %d times, want %d", step, calls.Load(), wantCalls)
		}
	}
	expect("first call", "miss", 1)
	expect("second call", "hit", 1)
	clock.advance(9 * time.Minute)
	expect("within the TTL", "hit", 1)
	clock.advance(2 * time.Minute)
	expect("after the TTL", "miss", 2)

	a.Close()
	b.Close()
	expect("every replica stopped, within the TTL", "hit", 2)
	clock.advance(11 * time.Minute)
	expect("every replica stopped, after the TTL", "stale", 2)

	for result, want := range map[string]float64{"miss": 2, "hit": 3, "stale": 1} {
		if v := counterValue(t, r, "cart_models_cache_total", `result="`+result+`"`); v != want {
			t.Fatalf("cart_models_cache_total{%s} = %v, want %v", result, v, want)
		}
	}
	r.waitLoadZero()
}

// With no cached copy and no replica answering, /v1/models fails with a
// clear 5xx in the OpenAI error shape.
func TestModelsWithoutCacheOrReplicaFailsClearly(t *testing.T) {
	t.Run("replicas unreachable", func(t *testing.T) {
		r := newRig(t, []string{closedURL(t), closedURL(t)})
		status, _, body := getModels(t, r)
		if status < 500 || status > 599 {
			t.Fatalf("status %d body %s, want 5xx", status, body)
		}
		assertOpenAIError(t, body, "models")
		r.waitLoadZero()
	})
	t.Run("no healthy replica", func(t *testing.T) {
		var calls atomic.Int64
		a := modelsBackend(t, "a", &calls)
		r := newRig(t, []string{a.URL})
		r.router.SetHealthy(a.URL, false)
		status, _, body := getModels(t, r)
		if status != http.StatusServiceUnavailable {
			t.Fatalf("status %d body %s, want 503", status, body)
		}
		assertOpenAIError(t, body, "healthy")
		if calls.Load() != 0 {
			t.Fatal("an unhealthy replica was asked for models")
		}
	})
}

// The breaker trial stays within the model filter: with the only replica
// serving the model behind an open breaker, the trial goes to it, never to
// a replica that does not serve the model.
func TestBreakerTrialKeepsModelFilter(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	reg := models.New()
	reg.SetWorkers([]models.Worker{{URL: a.URL, Declared: []string{"m"}}, {URL: b.URL, Declared: []string{"other"}}})
	a.set(answer503("a"))
	r := newWiredRig(t, []string{a.URL, b.URL}, defaultWiring(), withOptions(func(o *proxy.Options) { o.Models = reg }))
	for i := 0; r.workerViews()[a.URL].BreakerState != "open"; i++ {
		if i == 10 {
			t.Fatal("a's breaker did not open")
		}
		readAll(t, r.post("/v1/chat/completions", chatBody("s", fmt.Sprint("q", i), false)))
	}
	a.set(nil)
	resp := r.post("/v1/chat/completions", chatBody("s", "after recovery", false))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(body, "hi from a") {
		t.Fatalf("trial: %d %s", resp.StatusCode, body)
	}
	if n := b.hits.Load(); n != 0 {
		t.Fatalf("the replica without the model got %d requests", n)
	}
	r.waitLoadZero()
}

// Pass-through APIs name a model too (embeddings, rerank, ...): they go
// only to workers serving it, and a model nobody serves is a clear 404.
func TestPassThroughFollowsModels(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	reg := models.New()
	reg.SetWorkers([]models.Worker{{URL: a.URL, Declared: []string{"embed"}}, {URL: b.URL, Declared: []string{"m"}}})
	r := newWiredRig(t, []string{a.URL, b.URL}, defaultWiring(), withOptions(func(o *proxy.Options) {
		o.Models = reg
		o.PassThroughPaths = []string{"/v1/embeddings"}
	}))
	for i := range 8 {
		resp := r.post("/v1/embeddings", fmt.Sprintf(`{"model":"embed","input":"text %d"}`, i))
		if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("embeddings %d: %d %s", i, resp.StatusCode, body)
		}
	}
	if n := b.hits.Load(); n != 0 {
		t.Fatalf("the replica without the embedding model got %d of 8 requests", n)
	}
	// The model is read as the engine reads it: exact case, last duplicate.
	for _, body := range []string{`{"model":"embed","MODEL":"m","input":"x"}`, `{"model":"m","model":"embed","input":"x"}`} {
		resp := r.post("/v1/embeddings", body)
		if got := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", body, resp.StatusCode, got)
		}
	}
	if n := b.hits.Load(); n != 0 {
		t.Fatalf("a case variant or an earlier duplicate of \"model\" sent %d requests to the replica without the model", n)
	}
	resp := r.post("/v1/embeddings", `{"model":"nobody-serves-this","input":"x"}`)
	if body := readAll(t, resp); resp.StatusCode != http.StatusNotFound || !strings.Contains(body, "model_not_found") {
		t.Fatalf("unknown model: %d %s", resp.StatusCode, body)
	}
	r.waitLoadZero()
}
