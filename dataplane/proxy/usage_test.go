package proxy_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/dataplane/router"
	"github.com/cartrouter/cart/sim"
	"github.com/cartrouter/cart/sim/simtest"
)

// newClosedLoopRig is newRig with the closed loop on and a fake clock.
func newClosedLoopRig(t *testing.T, urls []string, clock *fakeClock) *rig {
	t.Helper()
	w := defaultWiring()
	w.now = clock.now
	return newWiredRig(t, urls, w, func(_ *proxy.Options, p *engine.Policy, _ []engine.WorkerSpec) { p.ClosedLoop = true })
}

func usageBody(path, prompt string, stream bool) string {
	m := map[string]any{"model": "m", "max_tokens": 2, "stream": stream}
	switch path {
	case "/v1/completions":
		m["prompt"] = prompt
	case "/v1/messages":
		m["system"] = prompt
		m["messages"] = []map[string]string{{"role": "user", "content": "q"}}
	default:
		m["messages"] = []map[string]string{{"role": "system", "content": prompt}, {"role": "user", "content": "q"}}
	}
	if stream && path != "/v1/messages" {
		m["stream_options"] = map[string]bool{"include_usage": true}
	}
	b, _ := json.Marshal(m)
	return string(b)
}

func (r *rig) workerView(t *testing.T) proxy.WorkerView {
	t.Helper()
	resp, err := http.Get(r.front.URL + "/workers")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ws struct{ Workers []proxy.WorkerView }
	if err := json.NewDecoder(resp.Body).Decode(&ws); err != nil {
		t.Fatal(err)
	}
	if len(ws.Workers) != 1 {
		t.Fatalf("workers %+v", ws.Workers)
	}
	return ws.Workers[0]
}

// A replica that leaves cache fields out of its usage (vLLM without
// --enable-prompt-tokens-details, and its /v1/messages always) tells CART
// nothing about its cache: prediction accuracy stays null, the closed loop
// leaves the modelled capacity alone and cart_cached_* stays empty, on every
// endpoint, streamed or not. With the fields, the same run scores the
// prediction and shrinks the capacity after a miss.
func TestUsageWithoutCacheDetailsIsUnknown(t *testing.T) {
	for _, details := range []bool{true, false} {
		for _, path := range []string{"/v1/chat/completions", "/v1/completions", "/v1/messages"} {
			for _, stream := range []bool{false, true} {
				t.Run(fmt.Sprintf("details=%v%s/stream=%v", details, path, stream), func(t *testing.T) {
					replica := simtest.Start(t, sim.Config{Name: "s", NoCacheDetails: !details, MaxConcurrency: 4})
					clock := &fakeClock{}
					r := newClosedLoopRig(t, []string{replica.URL}, clock)
					body := usageBody(path, longText("system prompt", 3000), stream)
					send := func() {
						t.Helper()
						resp := r.post(path, body)
						if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
							t.Fatalf("status %d: %s", resp.StatusCode, b)
						}
						r.waitLoadZero()
					}
					send() // miss: placed
					send() // hit, and the replica has it cached
					if got := replica.Stats().CachedTokens; got == 0 {
						t.Fatal("the replica reported no cache hit on a repeated prompt")
					}
					// The replica loses its cache after the placement settled:
					// the index predicts a hit the replica does not have.
					clock.advance(3 * time.Second)
					replica.Reset()
					send()

					w := r.workerView(t)
					cachedMetric := counterValue(t, r, "cart_cached_tokens_total", "")
					promptMetric := counterValue(t, r, "cart_prompt_tokens_total", "")
					if details {
						if w.PredictionAccuracy == nil || w.ActualCachedTokens == 0 || w.PredictedCachedTokens == 0 {
							t.Errorf("with cache details, accuracy not reported: %+v", w)
						}
						if w.CacheMisses != 1 || w.ModelCapacityBlocks == 0 {
							t.Errorf("with cache details, the miss did not shrink the model: %+v", w)
						}
						if cachedMetric == 0 || promptMetric == 0 {
							t.Errorf("cart_cached_tokens_total %v, cart_prompt_tokens_total %v", cachedMetric, promptMetric)
						}
						return
					}
					if w.PredictionAccuracy != nil || w.ActualCachedTokens != 0 || w.PredictedCachedTokens != 0 {
						t.Errorf("without cache details, accuracy counted unknown reports: %+v", w)
					}
					if w.CacheMisses != 0 || w.ModelCapacityBlocks != 0 {
						t.Errorf("without cache details, the closed loop acted on unknown reports: %+v", w)
					}
					if cachedMetric != 0 || promptMetric != 0 {
						t.Errorf("without cache details: cart_cached_tokens_total %v, cart_prompt_tokens_total %v", cachedMetric, promptMetric)
					}
				})
			}
		}
	}
}

// recordingRouter keeps the outcomes the proxy reports.
type recordingRouter struct {
	router.Router
	mu       sync.Mutex
	outcomes []router.Outcome
}

func (r *recordingRouter) Done(d router.Decision, o router.Outcome) {
	r.mu.Lock()
	r.outcomes = append(r.outcomes, o)
	r.mu.Unlock()
	r.Router.Done(d, o)
}

// The usage sniffer reads cache fields only where they are: absent fields
// are unknown (-1), present ones are read, including 0.
func TestUsageSniffing(t *testing.T) {
	cases := []struct {
		name, path, resp     string
		wantPrompt, wantCach int
	}{
		{"chat with details", "/v1/chat/completions",
			`{"usage":{"prompt_tokens":100,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":64}}}`, 100, 64},
		{"chat details zero", "/v1/chat/completions",
			`{"usage":{"prompt_tokens":100,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0}}}`, 100, 0},
		{"chat details null", "/v1/chat/completions",
			`{"usage":{"prompt_tokens":100,"completion_tokens":1,"prompt_tokens_details":null}}`, 100, -1},
		{"chat no details", "/v1/chat/completions",
			`{"usage":{"prompt_tokens":100,"completion_tokens":1,"total_tokens":101}}`, 100, -1},
		{"chat stream no details", "/v1/chat/completions",
			"data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n", 100, -1},
		{"messages with cache", "/v1/messages",
			`{"type":"message","usage":{"input_tokens":36,"cache_creation_input_tokens":0,"cache_read_input_tokens":64,"output_tokens":1}}`, 100, 64},
		{"messages without cache", "/v1/messages",
			`{"type":"message","usage":{"input_tokens":100,"output_tokens":1}}`, 100, -1},
		{"messages stream, cache only at start", "/v1/messages",
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":36,\"cache_read_input_tokens\":64,\"output_tokens\":0}}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":36,\"output_tokens\":1}}\n\n", 100, 64},
		{"messages stream without cache", "/v1/messages",
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":100,\"output_tokens\":0}}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":1}}\n\n", 100, -1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := newBackend(t, "a")
			b.set(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				_, _ = io.WriteString(w, c.resp)
			})
			var rec *recordingRouter
			r := newWiredRig(t, []string{b.URL}, wrapped(func(inner router.Router) router.Router { rec = &recordingRouter{Router: inner}; return rec }))
			resp := r.post(c.path, usageBody(c.path, "hello", false))
			readAll(t, resp)
			r.waitLoadZero()
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if len(rec.outcomes) != 1 {
				t.Fatalf("outcomes %+v", rec.outcomes)
			}
			if o := rec.outcomes[0]; o.PromptTokens != c.wantPrompt || o.CachedTokens != c.wantCach {
				t.Errorf("outcome prompt %d cached %d, want %d %d", o.PromptTokens, o.CachedTokens, c.wantPrompt, c.wantCach)
			}
		})
	}
}
