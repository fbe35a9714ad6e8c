package server_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/kvevents"
	"github.com/cartrouter/cart/sim"
	"github.com/cartrouter/cart/sim/simtest"
)

// BenchmarkKVEventsUnpredictedEvictions measures where the engines' KV
// events matter: the replicas evict what CART's model cannot predict, and
// the hit ratio of the requests CART routes is compared with events off
// and on. Four cart-sim replicas of 6,144 tokens each (declared to CART as
// cache_capacity_tokens in both runs, so the capacity is not what differs)
// serve 16 shared prefixes of 600 tokens (9,600 tokens: they fit in the
// pool) each followed by a unique question, 800 requests; the first 100
// are warm-up and not counted. The disturbances:
//
//   - side-traffic: after every 4 routed requests, 2 requests of 1,500
//     unique tokens go straight to replicas 0 and 1 (traffic that does not
//     pass through CART), flushing their caches within a few rounds;
//   - restarts: every 40 routed requests one replica, in turn, empties its
//     cache (cart-sim's /sim/reset, an engine restart or sleep/wake as the
//     events report it: AllBlocksCleared).
//
// Each runs with CART's model alone, with cache.closed_loop, and with the
// replicas' KV events. hit% is the routed requests' cached prompt tokens
// over their prompt tokens, as the replicas report them. Results and the command:
// bench/results/2026-12-07-kvevents/.
func BenchmarkKVEventsUnpredictedEvictions(b *testing.B) {
	for _, dist := range []string{"side-traffic", "restarts"} {
		// off: CART's model alone; closed-loop: plus cache.closed_loop,
		// which shrinks a worker's model when its usage reports show
		// fewer cached tokens than predicted (the way to notice without
		// events); events: workers[].kv_events.
		for _, mode := range []string{"off", "closed-loop", "events"} {
			b.Run(dist+"/"+mode, func(b *testing.B) {
				var hit float64
				for range b.N {
					hit = evictionRun(b, dist, mode)
				}
				b.ReportMetric(100*hit, "hit%")
			})
		}
	}
}

const (
	benchReplicas    = 4
	benchCacheTokens = 6144
	benchPrefixes    = 16
	benchPrefixChars = 2400 // cart-sim counts 4 bytes a token: 600 tokens
	benchRequests    = 800
	benchWarmup      = 100
)

func evictionRun(b *testing.B, dist, mode string) float64 {
	events := mode == "events"
	urls := make([]string, benchReplicas)
	entries := make([]string, benchReplicas)
	for i := range urls {
		pub, err := kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = pub.Close() })
		r := simtest.Start(b, sim.Config{Name: fmt.Sprint("r", i), Models: []string{"m"}, BlockTokens: 16,
			CacheTokens: benchCacheTokens, Seed: int64(i), KVEvents: pub})
		urls[i] = r.URL
		entries[i] = fmt.Sprintf("%s;cache_capacity_tokens: %d", r.URL, benchCacheTokens)
		if events {
			entries[i] += fmt.Sprintf(";kv_events: {endpoint: \"tcp://%s\", replay_endpoint: \"tcp://%s\"}", pub.Addr(), pub.ReplayAddr())
		}
	}
	a := newAllInOne(b, configFiles(b, workersYAML(entries...)+
		fmt.Sprintf("cache: {eviction_interval_secs: 1, closed_loop: %v}\n", mode == "closed-loop")))
	base := runAllInOne(b, a)
	if events {
		// Every stream known before the first request: an empty engine
		// says so with its reset's AllBlocksCleared.
		testkit.WaitFor(b, 20*time.Second, "every worker's events synced", func() bool {
			ws := workers(b, base)
			synced := 0
			for _, u := range urls {
				if ws[u].KVEvents != nil {
					synced++
				} else {
					post(b, u+"/sim/reset", "")
				}
			}
			return synced == len(urls)
		})
	}
	rng := rand.New(rand.NewPCG(7, 7))
	prefixes := make([]string, benchPrefixes)
	for i := range prefixes {
		prefixes[i] = longText(fmt.Sprint("system prompt ", i), benchPrefixChars)
	}
	var prompt, cached int
	for i := range benchRequests {
		p := prefixes[rng.IntN(len(prefixes))]
		pt, ct := complete(b, base, p+fmt.Sprintf(" question %d: %s", i, longText(fmt.Sprint("q", i), 200)))
		if i >= benchWarmup {
			prompt += pt
			cached += ct
		}
		switch {
		case dist == "side-traffic" && i%4 == 3:
			for _, u := range urls[:2] {
				complete(b, u, longText(fmt.Sprintf("side %s %d", u, i), 6000))
			}
		case dist == "restarts" && i%40 == 39:
			post(b, urls[(i/40)%len(urls)]+"/sim/reset", "")
			time.Sleep(20 * time.Millisecond)
		}
		if events {
			// Events flow asynchronously; a real client's think time lets
			// them land. 1 ms is far below an engine step.
			time.Sleep(time.Millisecond)
		}
	}
	return float64(cached) / float64(max(prompt, 1))
}

// complete sends one completion to base and returns the usage it reports.
func complete(tb testing.TB, base, prompt string) (promptTokens, cachedTokens int) {
	tb.Helper()
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompt, "max_tokens": 1})
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
			Details      struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if resp.StatusCode != http.StatusOK {
		tb.Fatalf("completion via %s: %s", base, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		tb.Fatal(err)
	}
	return out.Usage.PromptTokens, out.Usage.Details.CachedTokens
}
