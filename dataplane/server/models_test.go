package server_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/dataplane/server"
	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/sim"
	"github.com/cartrouter/cart/sim/simtest"
)

// modelSims starts n cart-sim replicas serving the base model "base".
func modelSims(t *testing.T, n int) []string {
	t.Helper()
	urls := simtest.URLs(t, n, func(i int) sim.Config { return sim.Config{Name: fmt.Sprint("sim", i), Models: []string{"base"}} })
	return urls
}

func simPost(t *testing.T, url, body string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %d %s", url, resp.StatusCode, b)
	}
}

func modelIDs(t *testing.T, base string) []string {
	t.Helper()
	var body struct {
		Object string
		Data   []struct{ ID string }
	}
	if code := getJSON(t, base+"/v1/models", &body); code != http.StatusOK || body.Object != "list" {
		t.Fatalf("/v1/models: %d %+v", code, body)
	}
	var ids []string
	for _, d := range body.Data {
		ids = append(ids, d.ID)
	}
	return ids
}

func chatModel(model, user string) string {
	b, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 1,
		"messages": []map[string]string{{"role": "user", "content": user}}})
	return string(b)
}

func postRaw(t *testing.T, url, body string) (int, string, []byte) {
	t.Helper()
	resp, b, _ := testkit.PostJSON(t, url, body)
	return resp.StatusCode, resp.Header.Get(proxy.HeaderRoutedPeer), []byte(b)
}

// A LoRA adapter loaded at run time on one of three replicas is learned by
// the next probe round and gets every request for it; once unloaded,
// requests for it are refused with 404 model_not_found instead of reaching
// a replica that would answer 404 itself.
func TestAdapterLoadedAtRuntimeGetsAllItsRequests(t *testing.T) {
	urls := modelSims(t, 3)
	a := newAllInOne(t, configFiles(t, workersYAML(urls...)+"health:\n  interval_secs: 0.05\n  timeout_secs: 0.05\n"))
	base := runAllInOne(t, a)

	testkit.WaitFor(t, 10*time.Second, "the base model in /v1/models", func() bool { return slices.Equal(modelIDs(t, base), []string{"base"}) })
	simPost(t, urls[1]+"/v1/load_lora_adapter", `{"lora_name":"sql-lora","lora_path":"/adapters/sql"}`)
	testkit.WaitFor(t, 10*time.Second, "the adapter in /v1/models", func() bool { return slices.Contains(modelIDs(t, base), "sql-lora") })

	for i := range 12 {
		code, peer, body := postRaw(t, base+"/v1/chat/completions", chatModel("sql-lora", fmt.Sprintf("question %d about tables", i)))
		if code != http.StatusOK || peer != urls[1] {
			t.Fatalf("request %d for the adapter: %d from %q (adapter on %s): %s", i, code, peer, urls[1], body)
		}
	}
	// The base model still spreads over the pool.
	peers := map[string]bool{}
	for i := range 30 {
		code, peer, body := postRaw(t, base+"/v1/chat/completions", chatModel("base", fmt.Sprintf("unrelated %d", i)))
		if code != http.StatusOK {
			t.Fatalf("base model: %d %s", code, body)
		}
		peers[peer] = true
	}
	if len(peers) < 2 {
		t.Fatalf("base-model requests all went to %v", peers)
	}

	simPost(t, urls[1]+"/v1/unload_lora_adapter", `{"lora_name":"sql-lora"}`)
	testkit.WaitFor(t, 10*time.Second, "the adapter gone from /v1/models", func() bool { return !slices.Contains(modelIDs(t, base), "sql-lora") })
	code, _, body := postRaw(t, base+"/v1/chat/completions", chatModel("sql-lora", "question after unload"))
	assertModelNotFound(t, code, body, false)
}

func assertModelNotFound(t *testing.T, code int, body []byte, anthropic bool) {
	t.Helper()
	if code != http.StatusNotFound {
		t.Fatalf("status %d, want 404: %s", code, body)
	}
	if anthropic {
		var e struct {
			Type  string
			Error struct{ Type, Message string }
		}
		if err := json.Unmarshal(body, &e); err != nil || e.Type != "error" || e.Error.Type != "not_found_error" || e.Error.Message == "" {
			t.Fatalf("not an Anthropic not_found_error: %s", body)
		}
		return
	}
	var e struct {
		Error struct{ Type, Code, Message string }
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Code != "model_not_found" || e.Error.Type != "invalid_request_error" || e.Error.Message == "" {
		t.Fatalf("not an OpenAI model_not_found error: %s", body)
	}
}

// Models declared in the config are routed on without any probe: the
// declared model goes only to its worker, an unknown model is refused in
// each endpoint's error shape, and /v1/models lists the union.
func TestDeclaredModelsWithoutProbing(t *testing.T) {
	r1, r2 := newReplica(t, "r1"), newReplica(t, "r2")
	a := newAllInOne(t, configFiles(t, workersYAML(r1.URL+";models: [llama, llama-lora]", r2.URL+";models: [llama, qwen]")))
	base := serveHTTP(t, a) // no health loop: nothing is probed

	if got := modelIDs(t, base); !slices.Equal(got, []string{"llama", "llama-lora", "qwen"}) {
		t.Fatalf("/v1/models = %v", got)
	}
	for i := range 6 {
		if code, peer, body := postRaw(t, base+"/v1/chat/completions", chatModel("llama-lora", fmt.Sprint("q", i))); code != http.StatusOK || peer != r1.URL {
			t.Fatalf("llama-lora: %d from %q: %s", code, peer, body)
		}
		if code, peer, body := postRaw(t, base+"/v1/chat/completions", chatModel("qwen", fmt.Sprint("q", i))); code != http.StatusOK || peer != r2.URL {
			t.Fatalf("qwen: %d from %q: %s", code, peer, body)
		}
	}
	before := r1.chats.Load() + r2.chats.Load()
	code, _, body := postRaw(t, base+"/v1/chat/completions", chatModel("gpt-unknown", "hi"))
	assertModelNotFound(t, code, body, false)
	code, _, body = postRaw(t, base+"/v1/messages", `{"model":"gpt-unknown","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`)
	assertModelNotFound(t, code, body, true)
	// A request without a model is not filtered.
	if code, _, body := postRaw(t, base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"no model"}]}`); code != http.StatusOK {
		t.Fatalf("no model: %d %s", code, body)
	}
	if after := r1.chats.Load() + r2.chats.Load(); after != before+1 {
		t.Fatalf("refused requests reached a replica: %d chats, want %d", after, before+1)
	}
}

// /v1/models answers the union of the healthy replicas' lists, first card
// of each id winning, and drops a replica once it is unhealthy.
func TestModelsUnionOfHealthyWorkers(t *testing.T) {
	r1, r2 := newReplica(t, "r1"), newReplica(t, "r2")
	a := newAllInOne(t, configFiles(t, workersYAML(r1.URL, r2.URL+";models: [extra]")))
	base := serveHTTP(t, a)
	a.Health.Round(t.Context())
	if got := modelIDs(t, base); !slices.Equal(got, []string{"cart-sim", "extra"}) {
		t.Fatalf("/v1/models = %v", got)
	}
	r2.health.Store(http.StatusServiceUnavailable)
	for range 2 { // failure_threshold
		a.Health.Round(t.Context())
	}
	if got := modelIDs(t, base); !slices.Equal(got, []string{"cart-sim"}) {
		t.Fatalf("/v1/models with r2 down = %v", got)
	}
}

// A data plane whose control plane is unreachable filters by model in its
// local fallback, from its boot workers' declared models.
func TestDataPlaneFallbackFiltersByModel(t *testing.T) {
	r1, r2 := newReplica(t, "r1"), newReplica(t, "r2")
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "http://" + dead.Addr().String()
	_ = dead.Close()
	cfg, err := config.Load(configFiles(t, workersYAML(r1.URL+";models: [lora]", r2.URL+";models: [base]")+
		"dataplane:\n  control_plane: ["+deadURL+"]\n")...)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(config.RoleDataPlane); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: time.Second}
	d, err := server.NewDataPlane(cfg, discardLogger(), client)
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(d.Proxy)
	t.Cleanup(func() { front.Close(); client.CloseIdleConnections() })
	for i := range 6 {
		if code, peer, body := postRaw(t, front.URL+"/v1/chat/completions", chatModel("lora", fmt.Sprint("q", i))); code != http.StatusOK || peer != r1.URL {
			t.Fatalf("lora via fallback: %d from %q: %s", code, peer, body)
		}
	}
	code, _, body := postRaw(t, front.URL+"/v1/messages", `{"model":"nope","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`)
	assertModelNotFound(t, code, body, true)
	if got := modelIDs(t, front.URL); !slices.Equal(got, []string{"lora", "base"}) {
		t.Fatalf("/v1/models = %v", got)
	}
}
