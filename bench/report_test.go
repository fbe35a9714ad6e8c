package bench

import (
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot/plotter"

	"github.com/cartrouter/cart/config"
)

func decodePNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s is not a valid PNG: %v", path, err)
	}
	if b := img.Bounds(); b.Dx() < 100 || b.Dy() < 100 {
		t.Errorf("%s is only %v", path, b)
	}
}

func TestChartsArePNG(t *testing.T) {
	dir := t.TempDir()
	bar := filepath.Join(dir, "bar.png")
	if err := BarChart(bar, "t", "y", []string{"a", "b", "c"},
		[]BarSeries{{Name: "s1", Values: []float64{1, 2, math.NaN()}}, {Name: "s2", Values: []float64{3}}},
		[]RefLine{{Name: "oracle", Y: 2.5}}); err != nil {
		t.Fatal(err)
	}
	decodePNG(t, bar)
	line := filepath.Join(dir, "line.png")
	if err := LineChart(line, "t", "x", "y", []float64{1, 2, 4},
		[]LineSeries{{Name: "d", Points: plotter.XYs{{X: 1, Y: 10}, {X: 2, Y: math.NaN()}, {X: 4, Y: 30}}}, {Name: "split", Points: plotter.XYs{{X: 4, Y: 5}}, Markers: true}},
		[]RefLine{{Name: "all-in-one", Y: 40}}); err != nil {
		t.Fatal(err)
	}
	decodePNG(t, line)
}

func TestWriteReport(t *testing.T) {
	dir := t.TempDir()
	sum := func(hit float64) *Summary {
		return &Summary{Requests: 10, Succeeded: 10, HitRatio: hit, OracleHitRatio: 0.8, HitVsOracle: hit / 0.8,
			TTFTMs: Latency{P50: 100, P90: 200, P99: 1500}, ReqPerS: 5, PerReplica: map[string]int{"a": 5, "b": 5}, Imbalance: 1}
	}
	res := &SuiteResults{
		StartedAt: time.Now(), FinishedAt: time.Now(), Config: DefaultSuiteConfig("/repo"),
		Slices: []SliceInfo{{Trace: "gsp", Requests: 10, SpanS: 1, Arrivals: "x", CacheTokens: 100}},
		Scenarios: []ScenarioResult{
			{Trace: "gsp", Scenario: ScenarioNginxRR, Status: "ok", Summary: sum(0.2)},
			{Trace: "gsp", Scenario: ScenarioCart, Status: "ok", Summary: sum(0.75), RouterMetrics: map[string]float64{`cart_fallback_total{cause="x"}`: 2}},
			{Trace: "gsp", Scenario: ScenarioDistPrefix + "1", Status: "ok", DataPlanes: 1, Summary: sum(0.7)},
			{Trace: "gsp", Scenario: ScenarioDistPrefix + "2", Status: "skipped", Reason: "control plane exited | boom"},
			{Trace: "gsp", Scenario: ScenarioSplit, Status: "ok", DataPlanes: 4, Summary: sum(0.4)},
		},
		Overhead: &OverheadResult{Config: DefaultOverhead(), CartOverNginx: 0.9,
			Targets: []OverheadTarget{{Name: "nginx", ReqPerS: 1000, CPUUsPerReq: 36.4}, {Name: "cart", ReqPerS: 900}, {Name: "direct", Skipped: "x"}}},
	}
	if err := WriteReport(dir, res); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"results.json", "summary.md", "machine.md", "hit_ratio.png", "ttft_gsp.png", "hit_vs_dataplanes.png"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("missing %s", f)
		}
	}
	decodePNG(t, filepath.Join(dir, "hit_vs_dataplanes.png"))
	md, _ := os.ReadFile(filepath.Join(dir, "summary.md"))
	for _, want := range []string{"| cart | 75.0% | 80.0% | 0.94 |", "skipped: control plane exited \\| boom", "CART / nginx throughput: **0.90**", "fallback{cause=\"x\"}=2",
		"| nginx | 1000 | 0.00 ms | 0.00 ms | 0 | 0 |  | 36 |", "| cart | 900 | 0.00 ms | 0.00 ms | 0 | 0 |  | not measured |",
		"the replica's not counted, except for direct"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("summary.md lacks %q:\n%s", want, md)
		}
	}
}

// TestGeneratedConfigsValidate checks the generated cart configs against
// the project's own loader for every role.
func TestGeneratedConfigsValidate(t *testing.T) {
	dir := t.TempDir()
	workers := []string{"http://127.0.0.1:8001", "http://127.0.0.1:8002"}
	for name, c := range map[string]struct {
		cfg  CartRouterConfig
		role config.Role
	}{
		"allinone": {CartRouterConfig{Port: 7000, Workers: workers, CacheTokens: 4096}, config.RoleAllInOne},
		"events": {CartRouterConfig{Port: 7000, Workers: workers, CacheTokens: 4096, Variant: "events",
			KVEvents: []string{"tcp://127.0.0.1:9001", "tcp://127.0.0.1:9002"}, KVReplay: []string{"tcp://127.0.0.1:9101", "tcp://127.0.0.1:9102"}}, config.RoleAllInOne},
		"cp1": {CartRouterConfig{Workers: workers, NodeID: "cp1", APIAddr: "127.0.0.1:7001", RaftAddr: "127.0.0.1:7002",
			DataDir: filepath.Join(dir, "cp1"), Bootstrap: true}, config.RoleControlPlane},
		"cp2": {CartRouterConfig{Workers: workers, NodeID: "cp2", APIAddr: "127.0.0.1:7003", RaftAddr: "127.0.0.1:7004",
			DataDir: filepath.Join(dir, "cp2"), Join: []string{"http://127.0.0.1:7001"}}, config.RoleControlPlane},
		"dp": {CartRouterConfig{Port: 7005, Workers: workers, ControlPlanes: []string{"http://127.0.0.1:7001", "http://127.0.0.1:7003"}, DataPlaneID: "dp1"}, config.RoleDataPlane},
	} {
		path := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(path, []byte(CartConfig(c.cfg)), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Load(path)
		if err == nil {
			err = cfg.Validate(c.role)
		}
		if err != nil {
			t.Errorf("%s: %v\n%s", name, err, CartConfig(c.cfg))
		}
		if name == "events" && (cfg.Workers[1].KVEvents.Endpoint != "tcp://127.0.0.1:9002" || cfg.Workers[1].CacheCapacityTokens != 0 || cfg.Cache.CapacityTokens != 0) {
			t.Errorf("events variant: %+v, capacity %d: want kv_events and no declared capacity", cfg.Workers[1], cfg.Cache.CapacityTokens)
		}
	}
}

func TestProxyConfigs(t *testing.T) {
	n := NginxConfig("/tmp/x", 9000, []string{"127.0.0.1:1", "127.0.0.1:2"}, true)
	for _, want := range []string{"least_conn;", "server 127.0.0.1:1", "server 127.0.0.1:2", "listen 127.0.0.1:9000;", "proxy_buffering off;", "proxy_http_version 1.1;", "keepalive 256;", "pid /tmp/x/nginx.pid;"} {
		if !strings.Contains(n, want) {
			t.Errorf("nginx.conf lacks %q", want)
		}
	}
	if strings.Contains(NginxConfig("/tmp/x", 9000, []string{"127.0.0.1:1"}, false), "least_conn") {
		t.Error("round robin config has least_conn")
	}
	h := HAProxyConfig(9100, []string{"127.0.0.1:5", "127.0.0.1:6"})
	for _, want := range []string{"mode tcp", "balance roundrobin", "bind 127.0.0.1:9100", "server b2 127.0.0.1:6"} {
		if !strings.Contains(h, want) {
			t.Errorf("haproxy.cfg lacks %q", want)
		}
	}
}

func TestSuiteProfiles(t *testing.T) {
	c := DefaultSuiteConfig("/repo")
	if p := c.Profile("sglang_gsp_default_blk512"); p.Limit != 512 || p.CacheTokens != 40960 {
		t.Errorf("gsp profile %+v", p)
	}
	c.Limit, c.CacheTokens = 50, 0
	if p := c.Profile("mooncake_conversation"); p.Limit != 50 || p.CacheTokens != 0 || p.Speedup != 8 {
		t.Errorf("overrides not applied: %+v", p)
	}
	c.Full = true
	if p := c.Profile("unknown"); p.Limit != 0 {
		t.Errorf("BENCH_FULL should take whole traces: %+v", p)
	}
	if c.TraceDir != filepath.Join("/", "shared", "traces") {
		t.Errorf("trace dir %s should be ../shared/traces from the repo root", c.TraceDir)
	}
}
