package bench

import (
	"math"
	"testing"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestPercentile(t *testing.T) {
	xs := []float64{10, 1, 9, 2, 8, 3, 7, 4, 6, 5} // 1..10 unsorted
	for _, c := range []struct{ p, want float64 }{
		{0, 1}, {50, 5.5}, {90, 9.1}, {99, 9.91}, {100, 10}, {25, 3.25}, {-5, 1}, {150, 10},
	} {
		if got := Percentile(xs, c.p); !near(got, c.want) {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	if xs[0] != 10 {
		t.Error("Percentile sorted its input in place")
	}
	if !math.IsNaN(Percentile(nil, 50)) {
		t.Error("empty input should be NaN")
	}
	if Percentile([]float64{7}, 99) != 7 {
		t.Error("single value")
	}
}

func TestSummarize(t *testing.T) {
	recs := []Record{
		{Status: 200, SentMs: 0, TTFTMs: 10, E2EMs: 100, Replica: "a", PromptTokens: 100, CachedTokens: 50, CompletionTokens: 10, OraclePromptTokens: 100, OracleCachedTokens: 80},
		{Status: 200, SentMs: 100, TTFTMs: 20, E2EMs: 200, Replica: "a", PromptTokens: 100, CachedTokens: 0, CompletionTokens: 10, OraclePromptTokens: 100, OracleCachedTokens: 0, CapDelayed: true},
		{Status: 200, SentMs: 200, TTFTMs: 30, E2EMs: 800, Replica: "b", PromptTokens: 200, CachedTokens: 100, CompletionTokens: 20, OraclePromptTokens: 200, OracleCachedTokens: 120},
		{Status: 503, SentMs: 300, E2EMs: 5, Error: "upstream down", OraclePromptTokens: 100, OracleCachedTokens: 0},
		{Error: errNotSent},
	}
	s := Summarize(recs, []string{"a", "b", "c"})
	if s.Requests != 5 || s.Succeeded != 3 || s.Errors != 2 || s.NotSent != 1 || s.CapDelayed != 1 {
		t.Fatalf("counts: %+v", s)
	}
	if s.ErrorKinds["http_503"] != 1 || s.ErrorKinds["not_sent"] != 1 {
		t.Errorf("error kinds %v", s.ErrorKinds)
	}
	if !near(s.HitRatio, 150.0/400.0) {
		t.Errorf("hit ratio %v", s.HitRatio)
	}
	if !near(s.OracleHitRatio, 200.0/500.0) {
		t.Errorf("oracle %v (sent requests count, failed or not)", s.OracleHitRatio)
	}
	if !near(s.HitVsOracle, (150.0/400.0)/(200.0/500.0)) {
		t.Errorf("hit/oracle %v", s.HitVsOracle)
	}
	if !near(s.TTFTMs.P50, 20) || !near(s.TTFTMs.Max, 30) || !near(s.TTFTMs.Mean, 20) {
		t.Errorf("ttft %+v", s.TTFTMs)
	}
	// Wall time: first send 0 ms to last completion 200+800 = 1000 ms.
	if !near(s.DurationS, 1) || !near(s.ReqPerS, 3) || !near(s.OutputTokensPerS, 40) || !near(s.TokensPerS, 440) {
		t.Errorf("throughput: %v s, %v req/s, %v tok/s, %v out tok/s", s.DurationS, s.ReqPerS, s.TokensPerS, s.OutputTokensPerS)
	}
	// a=2, b=1, c=0: mean 1, max 2.
	if s.PerReplica["c"] != 0 || !near(s.Imbalance, 2) {
		t.Errorf("per replica %v imbalance %v", s.PerReplica, s.Imbalance)
	}
}

func TestImbalance(t *testing.T) {
	if Imbalance(nil) != 0 || Imbalance(map[string]int{"a": 0}) != 0 {
		t.Error("empty")
	}
	if Imbalance(map[string]int{"a": 5, "b": 5}) != 1 {
		t.Error("even")
	}
	if Imbalance(map[string]int{"a": 8, "b": 0, "c": 0, "d": 0}) != 4 {
		t.Error("all on one of four")
	}
}

func TestParseCounters(t *testing.T) {
	text := `# HELP cart_fallback_total x
# TYPE cart_fallback_total counter
cart_fallback_total{cause="timeout"} 3
cart_fallback_total{cause="unavailable"} 1
cart_fallback_totally_other 9
cart_retries_total 2
cart_routing_decisions_total{reason="cache_hit"} 1.5e+01
`
	got := ParseCounters(text, routerMetricNames)
	want := map[string]float64{
		`cart_fallback_total{cause="timeout"}`:             3,
		`cart_fallback_total{cause="unavailable"}`:         1,
		`cart_retries_total`:                               2,
		`cart_routing_decisions_total{reason="cache_hit"}`: 15,
	}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

func TestParseWrk(t *testing.T) {
	out := `Running 10s test @ http://127.0.0.1:1/v1/chat/completions
  2 threads and 32 connections
  Latency Distribution
     50%  612.00us
     75%    1.10ms
     90%    2.00ms
     99%    4.50ms
  123456 requests in 10.00s, 50.00MB read
  Non-2xx or 3xx responses: 7
Requests/sec:  12345.60
`
	r, err := parseWrk(out, "u")
	if err != nil {
		t.Fatal(err)
	}
	if r.ReqPerS != 12345.6 || r.Requests != 123456 || r.Errors != 7 || !near(r.P50Ms, 0.612) || !near(r.P99Ms, 4.5) {
		t.Errorf("%+v", r)
	}
	if _, err := parseWrk("garbage", "u"); err == nil {
		t.Error("garbage parsed")
	}
}

func TestFlowCounters(t *testing.T) {
	if got := flowCounters(nil); len(got) != 0 {
		t.Errorf("no page answered: %v, want nothing", got)
	}
	quiet := "cart_flow_enqueued_total 3\ncart_requests_total{status=\"2xx\"} 9\n"
	got := flowCounters([]string{quiet, quiet})
	if len(got) != 2 || got["cart_flow_enqueued_total"] != 6 || got["cart_fallback_total"] != 0 {
		t.Errorf("two quiet routers: %v, want enqueued 6 and fallbacks 0", got)
	}
	if _, ok := got["cart_fallback_total"]; !ok {
		t.Error("fallbacks missing when no router fell back")
	}
	fell := "cart_fallback_total{reason=\"timeout\"} 2\n"
	got = flowCounters([]string{quiet, fell})
	if _, plain := got["cart_fallback_total"]; plain || got[`cart_fallback_total{reason="timeout"}`] != 2 {
		t.Errorf("one router fell back: %v, want only its labelled count", got)
	}
}
