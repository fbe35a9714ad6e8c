package server_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/sim"
	"github.com/cartrouter/cart/sim/simtest"
)

// simPool starts n cart-sim replicas and an all-in-one router over them
// with extra config appended, and returns the router's base URL.
func simPool(t *testing.T, n int, extra string) string {
	t.Helper()
	urls := simtest.URLs(t, n, func(i int) sim.Config { return sim.Config{Name: fmt.Sprint("sim", i), MaxConcurrency: 4} })
	return runAllInOne(t, newAllInOne(t, configFiles(t, workersYAML(urls...)+extra)))
}

// routeOf posts body to path and returns the routed peer and the reason
// the router gave, read from the decision counters around the request.
func routeOf(t *testing.T, base, path, body string) (peer, reason string) {
	t.Helper()
	reasons := []string{"cache_hit", "cache_miss", "hit_overloaded", "empty_text", "session_hit"}
	before := make(map[string]float64)
	mfs := scrape(t, base)
	for _, r := range reasons {
		before[r], _ = sample(mfs, "cart_routing_decisions_total", map[string]string{"reason": r})
	}
	req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: status %d", path, resp.StatusCode)
	}
	mfs = scrape(t, base)
	for _, r := range reasons {
		if v, _ := sample(mfs, "cart_routing_decisions_total", map[string]string{"reason": r}); v > before[r] {
			reason = r
		}
	}
	return resp.Header.Get(proxy.HeaderRoutedPeer), reason
}

func messagesBody(system []string, salt string) string {
	blocks := make([]map[string]string, len(system))
	for i, s := range system {
		blocks[i] = map[string]string{"type": "text", "text": s}
	}
	m := map[string]any{"model": "cart-sim", "max_tokens": 2, "system": blocks,
		"messages": []map[string]string{{"role": "user", "content": "What next?"}}}
	if salt != "" {
		m["cache_salt"] = salt
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// Claude Code's first system block carries a per-request hash. With the
// default config, two requests with the same long prompt and different
// billing hashes land on the same replica as a cache hit; with the prefix
// list emptied, the header makes each a miss.
func TestBillingHeaderDoesNotChangeRoute(t *testing.T) {
	prompt := longText("You are Claude Code, an interactive CLI tool", 6000)
	billing := func(i int) string {
		return fmt.Sprintf("x-anthropic-billing-header: cc_version=2.1.3.a1b; cc_entrypoint=cli; cch=%05x;", i*7919)
	}
	t.Run("default", func(t *testing.T) {
		base := simPool(t, 3, "")
		first, reason := routeOf(t, base, "/v1/messages", messagesBody([]string{billing(1), prompt}, ""))
		if reason != "cache_miss" {
			t.Fatalf("first request: reason %q", reason)
		}
		for i := 2; i <= 4; i++ {
			peer, reason := routeOf(t, base, "/v1/messages", messagesBody([]string{billing(i), prompt}, ""))
			if reason != "cache_hit" || peer != first {
				t.Fatalf("request %d: reason %q on %s, want cache_hit on %s", i, reason, peer, first)
			}
		}
	})
	t.Run("prefix list emptied", func(t *testing.T) {
		base := simPool(t, 3, "extract:\n  ignore_system_prefixes: []\n")
		for i := 1; i <= 3; i++ {
			if _, reason := routeOf(t, base, "/v1/messages", messagesBody([]string{billing(i), prompt}, "")); reason != "cache_miss" {
				t.Fatalf("request %d: reason %q, want cache_miss with the header in the key", i, reason)
			}
		}
	})
}

// A configured prefix drops a chat system message that changes per
// request (here a timestamp) from the key.
func TestCustomIgnorePrefixKeepsRoute(t *testing.T) {
	base := simPool(t, 3, "extract:\n  ignore_system_prefixes: [\"Current time:\"]\n")
	prompt := longText("Long shared instructions", 6000)
	body := func(i int) string {
		b, _ := json.Marshal(map[string]any{"model": "cart-sim", "max_tokens": 2, "messages": []map[string]string{
			{"role": "system", "content": fmt.Sprintf("Current time: 10:%02d:%02d", i, i*7%60)},
			{"role": "system", "content": prompt},
			{"role": "user", "content": "q"},
		}})
		return string(b)
	}
	first, _ := routeOf(t, base, "/v1/chat/completions", body(1))
	for i := 2; i <= 3; i++ {
		if peer, reason := routeOf(t, base, "/v1/chat/completions", body(i)); reason != "cache_hit" || peer != first {
			t.Fatalf("request %d: reason %q on %s, want cache_hit on %s", i, reason, peer, first)
		}
	}
}

// vLLM's cache_salt isolates caches on the endpoints that read it: the same
// prompt with another salt shares nothing with it, with the same salt it
// matches. vLLM's /v1/messages ignores the field, so there salted requests
// share the cache, and the index says so.
func TestCacheSaltSeparatesCaches(t *testing.T) {
	base := simPool(t, 3, "")
	prompt := longText("A long system prompt shared by two tenants", 6000)
	first, reason := routeOf(t, base, "/v1/messages", messagesBody([]string{prompt}, "tenant-a"))
	if reason != "cache_miss" {
		t.Fatalf("first request: reason %q", reason)
	}
	for _, salt := range []string{"tenant-b", "", "tenant-a"} {
		if peer, reason := routeOf(t, base, "/v1/messages", messagesBody([]string{prompt}, salt)); reason != "cache_hit" || peer != first {
			t.Fatalf("/v1/messages, salt %q after tenant-a: reason %q on %s, want cache_hit on %s", salt, reason, peer, first)
		}
	}
	for _, path := range []string{"/v1/chat/completions", "/v1/completions", "/v1/responses"} {
		body := func(salt string) string {
			m := map[string]any{"model": "cart-sim", "max_tokens": 2, "cache_salt": salt}
			switch path {
			case "/v1/completions":
				m["prompt"] = "completions " + prompt
			case "/v1/responses":
				m["input"] = "responses " + prompt
			default:
				m["messages"] = []map[string]string{{"role": "user", "content": "chat " + prompt}}
			}
			b, _ := json.Marshal(m)
			return string(b)
		}
		first, _ := routeOf(t, base, path, body("x"))
		if _, reason := routeOf(t, base, path, body("y")); reason != "cache_miss" {
			t.Fatalf("%s: other salt: reason %q", path, reason)
		}
		if peer, reason := routeOf(t, base, path, body("x")); reason != "cache_hit" || peer != first {
			t.Fatalf("%s: same salt: reason %q on %s, want cache_hit on %s", path, reason, peer, first)
		}
	}
}
