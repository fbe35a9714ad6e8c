package server_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cartrouter/cart/dataplane/breaker"
	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/sim"
	"github.com/cartrouter/cart/sim/simtest"
)

// After a mixed run through the all-in-one server (cache hits and misses,
// a retry, a breaker opening, a client hang-up, usage with cached tokens
// from sim replicas, /v1/models), GET /metrics exposes every metric with
// plausible values.
func TestMetricsAfterMixedRun(t *testing.T) {
	var sims []*sim.Server
	var urls []string
	for i := range 3 {
		r := simtest.Start(t, sim.Config{Name: fmt.Sprint("sim", i), TimeScale: 1, DecodeMsPerToken: 5, MaxConcurrency: 8})
		sims = append(sims, r.Server)
		urls = append(urls, r.URL)
	}
	const maxTree = 60
	paths := configFiles(t, workersYAML(urls...)+fmt.Sprintf(`
cache:
  max_tree_size: %d
  eviction_interval_secs: 0.05
`, maxTree))
	a := newAllInOne(t, paths)
	base := runAllInOne(t, a)

	ok := func(body string) {
		t.Helper()
		code, _, b := chat(t, base, body)
		if code != http.StatusOK {
			t.Fatalf("status %d: %s", code, b)
		}
	}
	// Cache misses then hits on a shared system prompt; the sims report
	// cached tokens for the repeats.
	system := longText("shared system prompt", 2500)
	for i := range 6 {
		ok(chatBody(system, fmt.Sprint("question ", i), false, 2))
	}
	// A streamed answer, usage in its last chunk.
	ok(chatBody(system, "streamed question", true, 3))
	// Distinct prompts overflow the small index: skipped inserts, evictions.
	for i := range 5 {
		ok(chatBody(longText(fmt.Sprint("other prompt ", i), 2000), "q", false, 1))
	}

	// A replica answering 503: retries, then its breaker opens.
	bad := urls[2]
	_ = sims[2].SetFault(sim.Fault{Mode: sim.FaultError, Status: http.StatusServiceUnavailable})
	for i := 0; a.Break.State(bad) != breaker.Open; i++ {
		if i == 100 {
			t.Fatal("the failing replica's breaker did not open in 100 requests")
		}
		ok(chatBody(longText(fmt.Sprint("breaker ", i), 300), "q", false, 1))
	}
	_ = sims[2].SetFault(sim.Fault{Mode: sim.FaultNone})

	// A client that hangs up mid-stream.
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chatBody(system, "a long answer please", true, 2000)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()

	// /v1/models: the union of the replicas' lists, learned by the
	// health loop's first round.
	for range 2 {
		r, err := http.Get(base + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}

	testkit.WaitFor(t, 10*time.Second, "the hang-up, evictions and zero in-flight", func() bool {
		mfs := scrape(t, base)
		d, _ := sample(mfs, "cart_client_disconnects_total", nil)
		e, _ := sample(mfs, "cart_index_evictions_total", nil)
		f, _ := sample(mfs, "cart_worker_in_flight", nil)
		return d >= 1 && e > 0 && f == 0
	})
	mfs := scrape(t, base)
	get := func(name string, l labels) float64 {
		t.Helper()
		v, found := sample(mfs, name, l)
		if !found {
			t.Fatalf("%s%v missing from /metrics", name, l)
		}
		return v
	}
	check := func(cond bool, format string, args ...any) {
		t.Helper()
		if !cond {
			t.Errorf(format, args...)
		}
	}

	ok2xx := get("cart_requests_total", labels{"endpoint": "chat_completions", "status": "2xx"})
	check(ok2xx >= 12, "cart_requests_total{2xx} = %v, want every successful request", ok2xx)
	byWorker := 0.0
	for _, u := range urls {
		v, _ := sample(mfs, "cart_requests_total", labels{"status": "2xx", "worker": u})
		byWorker += v
	}
	check(byWorker == ok2xx, "2xx requests labelled with a worker: %v of %v", byWorker, ok2xx)
	check(get("cart_requests_total", labels{"status": "499"}) >= 1, "the hang-up is not in cart_requests_total{499}")

	hits, misses := get("cart_routing_decisions_total", labels{"reason": "cache_hit"}), get("cart_routing_decisions_total", labels{"reason": "cache_miss"})
	check(hits > 0 && misses > 0, "decisions: cache_hit %v, cache_miss %v, want both > 0", hits, misses)
	decisions := get("cart_routing_decisions_total", nil)
	check(get("cart_routing_matched_ratio", nil) == decisions, "cart_routing_matched_ratio count %v != decisions %v", get("cart_routing_matched_ratio", nil), decisions)
	ratioSum := histSum(mfs, "cart_routing_matched_ratio", nil)
	check(ratioSum > 0 && ratioSum <= decisions, "matched ratio sum %v out of (0, %v]", ratioSum, decisions)
	check(get("cart_routing_decision_seconds", nil) == decisions, "decision latency count != decisions")
	check(histSum(mfs, "cart_routing_decision_seconds", nil)/decisions < 0.05, "mean decision latency %vs", histSum(mfs, "cart_routing_decision_seconds", nil)/decisions)

	for _, u := range urls {
		check(get("cart_worker_in_flight", labels{"worker": u}) == 0, "cart_worker_in_flight{%s} != 0 at the end", u)
		check(get("cart_worker_healthy", labels{"worker": u}) == 1, "cart_worker_healthy{%s} != 1", u)
	}
	retries := get("cart_retries_total", nil)
	check(retries >= 3, "cart_retries_total = %v, want >= 3 (one per failure of the bad replica)", retries)
	check(get("cart_retry_budget_exhausted_total", nil) == 0, "retry budget exhausted with sequential traffic")
	check(get("cart_circuit_breaker_state", labels{"worker": bad, "state": "open"}) == 1, "breaker of the bad replica not reported open")
	check(get("cart_circuit_breaker_state", labels{"worker": urls[0], "state": "closed"}) == 1, "breaker of a good replica not reported closed")
	check(get("cart_circuit_breaker_transitions_total", labels{"worker": bad, "to": "open"}) == 1, "breaker transition to open not counted")

	entries := get("cart_index_entries", nil)
	check(entries > 0 && entries <= maxTree+maxTree/8, "cart_index_entries = %v, want in (0, %d]", entries, maxTree+maxTree/8)
	check(get("cart_index_evictions_total", nil) > 0, "no index evictions with a %d-entry index", maxTree)
	skipped := get("cart_index_skipped_inserts_total", nil)
	check(get("cart_load_release_underflows_total", nil) == 0, "load release underflows")
	// The routing core times every lock hold: one per decision, one per
	// settlement, and the maintenance steps of the eviction loop.
	check(get("cart_decider_lock_hold_seconds", labels{"op": "route"}) >= decisions, "lock holds for routing %v < decisions %v",
		get("cart_decider_lock_hold_seconds", labels{"op": "route"}), decisions)
	check(get("cart_decider_lock_hold_seconds", labels{"op": "settle"}) > 0, "no lock holds recorded for settling")
	check(get("cart_decider_lock_hold_seconds", labels{"op": "maintain"}) > 0, "no lock holds recorded for maintenance")
	check(get("cart_decider_rejected_tickets_total", nil) == 0, "settlements refused for a foreign ticket")

	ttfb := get("cart_upstream_ttfb_seconds", nil)
	check(ttfb >= ok2xx, "cart_upstream_ttfb_seconds count %v < successful requests %v", ttfb, ok2xx)
	check(histSum(mfs, "cart_upstream_ttfb_seconds", nil) > 0, "ttfb sum is 0")

	prompt, cached := get("cart_prompt_tokens_total", nil), get("cart_cached_tokens_total", nil)
	predicted := get("cart_predicted_cached_tokens_total", nil)
	var simPrompt, simCached int64
	for _, s := range sims {
		st := s.Stats()
		simPrompt += st.PromptTokens
		simCached += st.CachedTokens
	}
	check(prompt > 0 && prompt <= float64(simPrompt), "cart_prompt_tokens_total %v, sims counted %d", prompt, simPrompt)
	check(cached > 0 && cached <= prompt && cached <= float64(simCached), "cart_cached_tokens_total %v (prompt %v, sims cached %d)", cached, prompt, simCached)
	check(predicted > 0, "cart_predicted_cached_tokens_total = %v", predicted)
	for _, kind := range []string{"predicted", "actual"} {
		n := get("cart_cached_fraction", labels{"kind": kind})
		sum := histSum(mfs, "cart_cached_fraction", labels{"kind": kind})
		check(n > 0 && sum > 0 && sum <= n, "cart_cached_fraction{%s}: count %v sum %v", kind, n, sum)
	}
	check(get("cart_client_disconnects_total", nil) >= 1, "client disconnect not counted")
	check(get("cart_models_cache_total", labels{"result": "pool"}) == 2, "models answers from the pool's lists != 2")
	t.Logf("requests 2xx %v, decisions %v (hit %v, miss %v), retries %v, index entries %v, skipped inserts %v, prompt tokens %v, cached %v, predicted %v",
		ok2xx, decisions, hits, misses, retries, entries, skipped, prompt, cached, predicted)
}
