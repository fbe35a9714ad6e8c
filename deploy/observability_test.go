package deploy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"go.yaml.in/yaml/v3"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/daemon"
	"github.com/cartrouter/cart/dataplane/server"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/internal/testkit/proc"
	"github.com/cartrouter/cart/sim"
	"github.com/cartrouter/cart/sim/simtest"
)

// controlPlaneMetrics are names a control-plane node must export on its API
// port (controlplane/service/metrics.go): the test scrapes a real node and
// fails on any of them missing.
var controlPlaneMetrics = []string{
	"cart_raft_leader", "cart_raft_term", "cart_raft_commit_index", "cart_raft_applied_index",
	"cart_raft_last_log_index", "cart_cp_routes_total", "cart_cp_route_seconds", "cart_cp_workers",
	"cart_cp_healthy_workers", "cart_cp_dataplanes", "cart_cp_index_entries",
	"cart_cp_index_evictions_total", "cart_cp_index_skipped_inserts_total",
}

var metricName = regexp.MustCompile(`\bcart_[A-Za-z0-9_]+`)

// baseName maps a histogram's series to its metric name.
func baseName(n string) string {
	for _, s := range []string{"_bucket", "_sum", "_count"} {
		if b, ok := strings.CutSuffix(n, s); ok {
			return b
		}
	}
	return n
}

// metricsIn extracts metric names from PromQL loosely: every identifier
// starting with cart_ (label values and strings here never do).
func metricsIn(expr string) []string {
	var out []string
	for _, m := range metricName.FindAllString(expr, -1) {
		out = append(out, baseName(m))
	}
	return out
}

type dashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query string `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int    `json:"id"`
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource *struct {
			Type string `json:"type"`
			UID  string `json:"uid"`
		} `json:"datasource"`
		GridPos struct{ H, W, X, Y int } `json:"gridPos"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	var d dashboard
	raw := readFile(t, "deploy", "grafana", "cart-dashboard.json")
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("cart-dashboard.json: %v", err)
	}
	return d
}

// dashboardExprs maps "panel title / refId" to the PromQL.
func dashboardExprs(t *testing.T) map[string]string {
	out := map[string]string{}
	for _, p := range loadDashboard(t).Panels {
		for _, tg := range p.Targets {
			out[p.Title+" / "+tg.RefID] = tg.Expr
		}
	}
	return out
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func alertExprs(t *testing.T) map[string]string {
	var rf ruleFile
	if err := yaml.Unmarshal(readFile(t, "deploy", "prometheus", "alerts.yml"), &rf); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	out := map[string]string{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			out[r.Alert] = r.Expr
		}
	}
	return out
}

func TestDashboardStructure(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Error("dashboard needs a uid (stable links, provisioning) and a title")
	}
	if !slices.ContainsFunc(d.Templating.List, func(v struct {
		Name  string `json:"name"`
		Type  string `json:"type"`
		Query string `json:"query"`
	}) bool {
		return v.Name == "datasource" && v.Type == "datasource" && v.Query == "prometheus"
	}) {
		t.Error("no datasource template variable: the dashboard would be tied to one Prometheus")
	}
	ids := map[int]bool{}
	cells := map[[2]int]string{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d is used twice", p.ID)
		}
		ids[p.ID] = true
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X+g.W > 24 {
			t.Errorf("panel %q gridPos %+v is outside the 24-column grid", p.Title, g)
		}
		for y := g.Y; y < g.Y+g.H; y++ {
			for x := g.X; x < g.X+g.W; x++ {
				if other, ok := cells[[2]int{x, y}]; ok {
					t.Errorf("panels %q and %q overlap", p.Title, other)
				}
				cells[[2]int{x, y}] = p.Title
			}
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q does not use the ${datasource} variable", p.Title)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no queries", p.Title)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.Expr == "" || tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("panel %q: query %q with refId %q (empty or duplicate)", p.Title, tg.Expr, tg.RefID)
			}
			refs[tg.RefID] = true
			if strings.Contains(tg.Expr, "[5m]") || strings.Contains(tg.Expr, "[1m]") {
				t.Errorf("panel %q hard-codes a rate window (%s): use $__rate_interval", p.Title, tg.Expr)
			}
		}
	}
	// The panels the runbook relies on.
	all := strings.Join(slices.Collect(func(yield func(string) bool) {
		for _, e := range dashboardExprs(t) {
			if !yield(e) {
				return
			}
		}
	}), "\n")
	for _, want := range []string{
		"cart_requests_total", "cart_routing_decisions_total", "cart_cached_tokens_total", "cart_prompt_tokens_total",
		"cart_predicted_cached_tokens_total", "cart_upstream_ttfb_seconds_bucket", "cart_worker_in_flight",
		"cart_circuit_breaker_state", "cart_worker_healthy", "cart_raft_leader", "cart_raft_term",
		"cart_raft_commit_index - cart_raft_applied_index", "cart_fallback_total",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("no dashboard query uses %s", want)
		}
	}
}

// TestPromQL runs promtool over the scrape config, the alert rules and
// their unit tests, and over every dashboard query (as recording rules, the
// one way promtool parses a bare expression).
func TestPromQL(t *testing.T) {
	pt := tool(t, "apt-get install prometheus (for promtool)", "promtool")
	dir := path(t, "deploy", "prometheus")
	run(t, dir, pt, "check", "config", "prometheus.yml")
	run(t, dir, pt, "check", "rules", "alerts.yml")
	run(t, dir, pt, "test", "rules", "alerts_test.yml")

	type rule struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	var rules []rule
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range dashboardExprs(t) {
			if !yield(k) {
				return
			}
		}
	})
	exprs := dashboardExprs(t)
	grafanaVars := strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")
	for i, k := range keys {
		rules = append(rules, rule{Record: fmt.Sprintf("dashboard:query_%d", i), Expr: grafanaVars.Replace(exprs[k])})
	}
	out, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "dashboard-rules.yml")
	if err := os.WriteFile(f, out, 0o644); err != nil {
		t.Fatal(err)
	}
	if o, err := runErr(t.TempDir(), nil, pt, "check", "rules", f); err != nil {
		t.Fatalf("dashboard queries do not parse: %v\n%s\nqueries:\n%s", err, o, out)
	}
}

func TestEveryAlertHasAUnitTest(t *testing.T) {
	tests := string(readFile(t, "deploy", "prometheus", "alerts_test.yml"))
	for name := range alertExprs(t) {
		if !strings.Contains(tests, "alertname: "+name+"\n") {
			t.Errorf("alert %s has no case in alerts_test.yml", name)
		}
	}
	for _, want := range []string{"CartNoRaftLeader", "CartFallbackRateHigh", "CartAllWorkersUnhealthy", "CartCacheHitRatioCollapse"} {
		if _, ok := alertExprs(t)[want]; !ok {
			t.Errorf("alert %s is missing", want)
		}
	}
	if e := alertExprs(t)["CartNoRaftLeader"]; strings.TrimSpace(e) != "max(cart_raft_leader) == 0" {
		t.Errorf("CartNoRaftLeader expr %q", e)
	}
	if e := alertExprs(t)["CartAllWorkersUnhealthy"]; strings.TrimSpace(e) != "sum(cart_worker_healthy) == 0" {
		t.Errorf("CartAllWorkersUnhealthy expr %q", e)
	}
}

// TestDashboardAndAlertMetricsAreExported: every metric the dashboard and
// the alerts use is exported by a running CART.
func TestDashboardAndAlertMetricsAreExported(t *testing.T) {
	used := map[string][]string{} // metric -> where
	for where, e := range dashboardExprs(t) {
		for _, m := range metricsIn(e) {
			used[m] = append(used[m], "dashboard: "+where)
		}
	}
	for where, e := range alertExprs(t) {
		for _, m := range metricsIn(e) {
			used[m] = append(used[m], "alert "+where)
		}
	}
	if len(used) < 20 {
		t.Fatalf("found only %d metric names; the extraction is broken", len(used))
	}
	dp := scrapeDataPlaneMetrics(t)
	cp := scrapeControlPlaneMetrics(t)
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range used {
			if !yield(n) {
				return
			}
		}
	})
	for _, n := range names {
		if !dp[n] && !cp[n] {
			sort.Strings(used[n])
			t.Errorf("%s is used by %v but not exported by a data plane, all-in-one router or control-plane node", n, used[n])
		}
	}
	for _, n := range controlPlaneMetrics {
		if !cp[n] {
			t.Errorf("controlPlaneMetrics lists %s, which a control-plane node does not export", n)
		}
	}
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// scrapeNames returns every metric family in a /metrics page: names from
// # HELP lines (present even before a vector has a series) and samples.
func scrapeNames(t *testing.T, url string) (map[string]bool, int) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	names := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if rest, ok := strings.CutPrefix(l, "# HELP "); ok {
			names[strings.Fields(rest)[0]] = true
		} else if l != "" && !strings.HasPrefix(l, "#") {
			n := l[:strings.IndexAny(l, "{ ")]
			names[baseName(n)] = true
		}
	}
	return names, resp.StatusCode
}

func chat(t *testing.T, base, text string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{
		"model":    "cart-sim",
		"messages": []any{map[string]string{"role": "user", "content": text}},
	})
	if resp, _, _ := testkit.PostJSON(t, base+"/v1/chat/completions", string(body)); resp.StatusCode != http.StatusOK {
		t.Fatalf("chat completion through CART: %s", resp.Status)
	}
}

// scrapeDataPlaneMetrics drives an all-in-one router and a data plane with
// traffic that touches every labelled series (Prometheus vectors appear only
// once a label set was used), then scrapes both.
func scrapeDataPlaneMetrics(t *testing.T) map[string]bool {
	t.Helper()
	replica := simtest.Start(t, sim.Config{Name: "s"})
	// A worker that refuses connections makes retries and opens a breaker.
	deadURL := "http://" + testkit.FreeAddr(t)

	cfg := config.Default()
	cfg.Workers = []config.Worker{{URL: replica.URL}, {URL: deadURL}}
	cfg.CircuitBreaker.FailureThreshold = 1
	cfg.Server.MinOpenFiles = 0
	cfg.Normalize()
	if err := cfg.Validate(config.RoleAllInOne); err != nil {
		t.Fatal(err)
	}
	a, err := server.NewAllInOne(cfg, nil, quietLogger(), 1)
	if err != nil {
		t.Fatal(err)
	}
	aio := httptest.NewServer(a.Proxy)
	t.Cleanup(aio.Close)
	// Distinct prompts are cache misses, spread over both workers: the dead
	// one fails, is retried on the live one and its breaker opens.
	shared := strings.Repeat("You are a helpful assistant for the CART deployment test. ", 20)
	for i := range 16 {
		chat(t, aio.URL, fmt.Sprintf("%d: %s", i, shared))
	}
	chat(t, aio.URL, "0: "+shared) // a cache hit
	if resp, err := http.Get(aio.URL + "/v1/models"); err == nil {
		resp.Body.Close()
	}
	_ = a.Reload() // no config files: rejected, which counts a reload result

	// A data plane whose control plane is unreachable routes by fallback.
	dcfg := config.Default()
	dcfg.Workers = []config.Worker{{URL: replica.URL}}
	dcfg.DataPlane.ControlPlane = []string{deadURL}
	dcfg.Server.MinOpenFiles = 0
	dcfg.Normalize()
	if err := dcfg.Validate(config.RoleDataPlane); err != nil {
		t.Fatal(err)
	}
	d, err := server.NewDataPlane(dcfg, quietLogger(), &http.Client{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	dps := httptest.NewServer(d.Proxy)
	t.Cleanup(dps.Close)
	chat(t, dps.URL, shared+" via the data plane")

	names, status := scrapeNames(t, aio.URL+"/metrics")
	if status != http.StatusOK {
		t.Fatalf("all-in-one /metrics: %d", status)
	}
	more, status := scrapeNames(t, dps.URL+"/metrics")
	if status != http.StatusOK {
		t.Fatalf("data plane /metrics: %d", status)
	}
	for n := range more {
		names[n] = true
	}
	return names
}

// scrapeControlPlaneMetrics starts a one-node control plane in process
// (bootstrapped, temp data dir), checks the gRPC health call the
// Kubernetes readiness probe and the compose healthcheck make, routes one
// request, and returns the metric names GET /metrics serves on the API
// port.
func scrapeControlPlaneMetrics(t *testing.T) map[string]bool {
	t.Helper()
	cfg := config.Default()
	cfg.ControlPlane.NodeID = "cp-test"
	cfg.ControlPlane.DataDir = t.TempDir()
	cfg.ControlPlane.Bootstrap = true
	cfg.ControlPlane.APIAddr = testkit.FreeAddr(t)
	cfg.ControlPlane.RaftAddr = testkit.FreeAddr(t)
	// No seed list: the worker is added through the admin API below, the
	// path the Helm hook Job takes.
	cfg.Workers = nil
	cfg.Auth.Token = "test-token"
	cfg.Normalize()
	if err := cfg.Validate(config.RoleControlPlane); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d, err := daemon.Start(ctx, cfg, quietLogger())
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", cfg.ControlPlane.APIAddr)
	if err != nil {
		cancel()
		_ = d.Node.Shutdown()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Error("control plane did not stop")
		}
	})
	base := "http://" + cfg.ControlPlane.APIAddr

	// gRPC health over cleartext HTTP/2, as the kubelet's grpc probe asks.
	h2c := testkit.H2CClient()
	h2c.Timeout = 5 * time.Second
	health := grpchealth.NewClient(h2c, base, connect.WithGRPC())
	testkit.WaitForMsg(t, 20*time.Second, "the control plane to report SERVING on gRPC health", func() (bool, string) {
		resp, err := health.Check(ctx, &grpchealth.CheckRequest{})
		return err == nil && resp.Status == grpchealth.StatusServing, fmt.Sprint(resp, err)
	})

	// One worker (AddWorker, as `cartctl workers add` in the Helm hook
	// does) and one routing decision, so the per-reason counter has a series.
	admin := cartv1connect.NewAdminServiceClient(h2c, base, connect.WithGRPC())
	// Serving gRPC health precedes the node taking up leadership (it
	// publishes its URL first): until then a write is a definite "not
	// done" (Unavailable), which a client retries, as cartctl does.
	testkit.WaitForMsg(t, 20*time.Second, "AddWorker", func() (bool, string) {
		add := connect.NewRequest(&cartv1.AddWorkerRequest{Worker: &cartv1.Worker{Url: "http://127.0.0.1:9"}})
		add.Header().Set("Authorization", "Bearer test-token")
		_, err := admin.AddWorker(ctx, add)
		if err != nil && connect.CodeOf(err) != connect.CodeUnavailable {
			t.Fatalf("AddWorker: %v", err)
		}
		return err == nil, fmt.Sprint(err)
	})
	probeControlPlane(t, base)
	router := cartv1connect.NewRouterServiceClient(h2c, base, connect.WithGRPC())
	req := connect.NewRequest(&cartv1.RouteRequest{Endpoint: "chat_completions", Model: "m", Text: "hello from the deploy test", DataplaneId: "test", DryRun: true})
	req.Header().Set("Authorization", "Bearer test-token")
	if _, err := router.Route(ctx, req); err != nil {
		t.Fatalf("Route: %v", err)
	}

	names, status := scrapeNames(t, base+"/metrics")
	if status != http.StatusOK {
		t.Fatalf("control plane GET /metrics: %d", status)
	}
	return names
}

// probeControlPlane runs the image's cart-probe against a real node, the
// exact commands of the compose healthcheck and of the Helm chart's init
// containers.
func probeControlPlane(t *testing.T, base string) {
	t.Helper()
	bin := proc.Build(t, "github.com/cartrouter/cart/deploy/docker/probe")
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("test-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, repoRoot(t), bin, "grpc", base)
	run(t, repoRoot(t), bin, "-wait=10s", "-interval=100ms", "-token-file="+token, "workers", base)
	if out, err := runErr(repoRoot(t), nil, bin, "-token-file="+filepath.Join(t.TempDir(), "missing"), "workers", base); err == nil {
		t.Errorf("cart-probe workers without a readable token file succeeded: %s", out)
	}
}
