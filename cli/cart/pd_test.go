package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/discovery/dnstest"
	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/internal/testkit/proc"
	"github.com/cartrouter/cart/sim"
	"github.com/cartrouter/cart/sim/simtest"
)

// The real cart binary with every prefill/decode key set, idling past
// maintenance passes (eviction every second) before and between requests:
// workers[].role, disaggregation.mode/threshold_tokens/endpoints,
// discovery.dns.prefill_name/decode_name and discovery.kubernetes.
// role_label. A long chat prompt is split between a static prefill and a
// static decode worker, or the discovered ones; a short one goes whole (the
// threshold); a messages request is not split (not in endpoints).
// Kubernetes discovery has no API server here: the process runs with the
// key on and its watcher stale (the label's effect is
// controlplane/discovery's TestKubernetesRoleLabel, against client-go's
// fake clientset).
func TestPDKeysAllInOne(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the cart binary")
	}
	bin := proc.Build(t, ".")
	mk := func(name, role string) *simtest.Replica {
		return simtest.Start(t, sim.Config{Name: name, Role: role, BlockTokens: 16, OutputTokens: 4, Models: []string{"sim", "claude-sim"}})
	}
	pre, dec := mk("pre", sim.RolePrefill), mk("dec", sim.RoleDecode)
	dpre, ddec := mk("dns-pre", sim.RolePrefill), mk("dns-dec", sim.RoleDecode)
	ns := dnstest.Start(t)
	ns.Set(t, "r.pool. 1 IN A 127.0.0.1",
		"_p._tcp.pool. 1 IN SRV 0 0 "+portOf(dpre.URL)+" r.pool.",
		"_d._tcp.pool. 1 IN SRV 0 0 "+portOf(ddec.URL)+" r.pool.")
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	writeTestFile(t, kc, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: inference}}]
current-context: x
`)
	port := testkit.FreePort(t)
	cfg := filepath.Join(dir, "cart.yaml")
	writeTestFile(t, cfg, fmt.Sprintf(`server: {host: 127.0.0.1, port: %d, min_open_files: 0}
log: {level: info, format: text}
cache: {eviction_interval_secs: 1}
health: {interval_secs: 0.5, timeout_secs: 0.5}
proxy: {add_routed_peer_header: true}
workers:
  - {url: %s, role: prefill}
  - {url: %s, role: decode}
disaggregation:
  mode: vllm
  threshold_tokens: 40
  endpoints: [chat_completions, completions]
discovery:
  allowed_networks: [127.0.0.0/8] # the test workers are on loopback
  dns: {prefill_name: _p._tcp.pool, decode_name: _d._tcp.pool, record_type: SRV, resolver: %s, min_interval_secs: 0.2, max_interval_secs: 0.5}
  kubernetes: {enabled: true, selector: app=vllm, port: http, role_label: llm-d.ai/role, kubeconfig: %s, namespace: inference, sync_timeout_secs: 1}
`, port, pre.URL, dec.URL, ns.Addr, kc))
	p := proc.Start(t, proc.Cmd{Path: bin, Args: []string{"-c", cfg}})
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	p.WaitFor(t, 20*time.Second, "four workers, with their roles", func() (bool, string) {
		roles, err := workerRoles(base)
		want := map[string]string{pre.URL: "prefill", dec.URL: "decode", dpre.URL: "prefill", ddec.URL: "decode"}
		return err == nil && fmt.Sprint(roles) == fmt.Sprint(want), fmt.Sprint(roles, err)
	})
	idlePastMaintenance(t, p, base+"/metrics", 0)
	if !p.Running() {
		t.Fatalf("cart exited:\n%s", p.Log.Tail(40))
	}

	long := strings.Repeat("a long prompt worth a KV transfer. ", 40)
	for i := range 4 {
		h := chatHeaders(t, base, "/v1/chat/completions", fmt.Sprintf(`{"model":"sim","stream":true,"messages":[{"role":"user","content":"%s %d"}]}`, long, i))
		if !strings.HasPrefix(h.Get(proxy.HeaderRoutedPrefillPeer), "http://") || h.Get(proxy.HeaderRoutedPeer) == "" {
			t.Fatalf("a long chat request was not split: %v", h)
		}
	}
	h := chatHeaders(t, base, "/v1/completions", `{"model":"sim","prompt":"`+long+`"}`)
	if h.Get(proxy.HeaderRoutedPrefillPeer) == "" {
		t.Fatalf("a long completions request was not split: %v", h)
	}
	if h := chatHeaders(t, base, "/v1/chat/completions", `{"model":"sim","messages":[{"role":"user","content":"hi"}]}`); h.Get(proxy.HeaderRoutedPrefillPeer) != "" {
		t.Fatalf("a short prompt under threshold_tokens was split: %v", h)
	}
	if h := chatHeaders(t, base, "/v1/messages", `{"model":"claude-sim","max_tokens":4,"messages":[{"role":"user","content":"`+long+`"}]}`); h.Get(proxy.HeaderRoutedPrefillPeer) != "" {
		t.Fatalf("a messages request was split though messages is not in disaggregation.endpoints: %v", h)
	}
	var legs int64
	for _, r := range []*simtest.Replica{pre, dpre} {
		legs += r.Stats().PD.PrefillLegs
	}
	if legs != 5 {
		t.Fatalf("%d prefill legs, want 5", legs)
	}
	idlePastMaintenance(t, p, base+"/metrics", 0)
	if !p.Running() || p.Log.Contains("panic") {
		t.Fatalf("cart died or panicked:\n%s", p.Log.Tail(40))
	}
}

// A control plane with the role-bearing keys (workers[].role, discovery
// by role, threshold_tokens) and a data plane in sidecar mode, both real
// processes idling past maintenance passes: the data plane sends a split
// request to the decode worker only, naming the prefill worker in
// X-Prefiller-Host-Port as llm-d's routing sidecar expects.
func TestPDKeysDistributedSidecar(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the cart binary")
	}
	bin := proc.Build(t, ".")
	pre := simtest.Start(t, sim.Config{Name: "pre", Role: sim.RolePrefill, Models: []string{"sim"}})
	var mu sync.Mutex
	var hints []string
	sidecar := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/chat/completions":
		case "/v1/models":
			_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"sim","object":"model"}]}`)
			return
		default: // /health, the engine metrics /metrics
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		hints = append(hints, r.Header.Get(proxy.HeaderPrefillerHostPort))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"from the sidecar"}}]}`)
	}))
	t.Cleanup(sidecar.Close)
	ns := dnstest.Start(t)
	ns.Set(t, "r.pool. 1 IN A 127.0.0.1", "_p._tcp.pool. 1 IN SRV 0 0 "+portOf(pre.URL)+" r.pool.")

	dir := t.TempDir()
	api, raft := testkit.FreeAddr(t), testkit.FreeAddr(t)
	cpCfg := filepath.Join(dir, "cp.yaml")
	writeTestFile(t, cpCfg, fmt.Sprintf(`server: {min_open_files: 0}
cache: {eviction_interval_secs: 1}
health: {interval_secs: 0.5, timeout_secs: 0.5}
controlplane: {node_id: n1, api_addr: %s, raft_addr: %s, data_dir: %s, bootstrap: true}
workers:
  - {url: %s, role: decode}
disaggregation: {threshold_tokens: 16}
discovery:
  allowed_networks: [127.0.0.0/8] # the test workers are on loopback
  dns: {prefill_name: _p._tcp.pool, record_type: SRV, resolver: %s, min_interval_secs: 0.2, max_interval_secs: 0.5}
`, api, raft, filepath.Join(dir, "raft"), sidecar.URL, ns.Addr))
	cp := proc.Start(t, proc.Cmd{Name: "cp", Path: bin, Args: []string{"controlplane", "-c", cpCfg}})
	port := testkit.FreePort(t)
	dpCfg := filepath.Join(dir, "dp.yaml")
	writeTestFile(t, dpCfg, fmt.Sprintf(`server: {host: 127.0.0.1, port: %d, min_open_files: 0}
cache: {eviction_interval_secs: 1}
proxy: {add_routed_peer_header: true}
dataplane: {id: dp1, control_plane: [http://%s], worker_sync_interval_ms: 200, route_timeout_ms: 250}
disaggregation: {mode: sidecar, endpoints: [chat_completions]}
`, port, api))
	dp := proc.Start(t, proc.Cmd{Name: "dp", Path: bin, Args: []string{"dataplane", "-c", dpCfg}})
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	dp.WaitFor(t, 30*time.Second, "a decode and a discovered prefill worker", func() (bool, string) {
		roles, err := workerRoles(base)
		return err == nil && roles[pre.URL] == "prefill" && roles[sidecar.URL] == "decode", fmt.Sprint(roles, err)
	})
	time.Sleep(2500 * time.Millisecond)
	h := chatHeaders(t, base, "/v1/chat/completions", `{"model":"sim","messages":[{"role":"user","content":"`+strings.Repeat("split me please ", 30)+`"}]}`)
	if h.Get(proxy.HeaderRoutedPeer) != sidecar.URL || h.Get(proxy.HeaderRoutedPrefillPeer) != pre.URL {
		t.Fatalf("routed %v", h)
	}
	mu.Lock()
	got := append([]string(nil), hints...)
	mu.Unlock()
	if len(got) != 1 || got[0] != strings.TrimPrefix(pre.URL, "http://") {
		t.Fatalf("the sidecar got X-Prefiller-Host-Port %q, want %q", got, strings.TrimPrefix(pre.URL, "http://"))
	}
	if pre.Stats().Requests != 0 {
		t.Fatal("CART ran a prefill leg itself in sidecar mode")
	}
	time.Sleep(1500 * time.Millisecond)
	for _, pr := range []*proc.Proc{cp, dp} {
		if !pr.Running() || pr.Log.Contains("panic") {
			t.Fatalf("%s died or panicked:\n%s", pr.Name, pr.Log.Tail(40))
		}
	}
}

func portOf(u string) string { return u[strings.LastIndexByte(u, ':')+1:] }

func writeTestFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// workerRoles reads a router's GET /workers: URL -> role.
func workerRoles(base string) (map[string]string, error) {
	resp, err := http.Get(base + "/workers")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var v struct {
		Workers []struct {
			URL, Role string
		} `json:"workers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, w := range v.Workers {
		out[w.URL] = w.Role
	}
	return out, nil
}

// chatHeaders posts body to path and returns the answer's headers, after
// reading it whole; anything but 200 fails the test.
func chatHeaders(t *testing.T, base, path, body string) http.Header {
	t.Helper()
	resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
	}
	return resp.Header
}
