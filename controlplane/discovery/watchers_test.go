package discovery_test

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/discovery"
)

// Both sources run side by side, each tagging its workers with its own
// defaults; a kubeconfig that cannot be read fails at start, not later.
func TestWatchersKubernetes(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	// Never contacted: the test stops at building the watchers.
	kubeconfig := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: inference}}]
current-context: x
`
	if err := os.WriteFile(kc, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Discovery.DNS.Name, cfg.Discovery.DNS.Port, cfg.Discovery.DNS.Resolver = "sim", 8000, "127.0.0.1:53"
	cfg.Discovery.DNS.MaxLoad = 3
	k := &cfg.Discovery.Kubernetes
	k.Enabled, k.Service, k.Port, k.Kubeconfig, k.MaxLoad, k.CacheCapacityTokens = true, "vllm", "http", kc, 7, 9000
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var sources []string
	ws, err := discovery.Watchers(cfg, log, discovery.NewMetrics(prometheus.NewRegistry()),
		func(source string) discovery.Sink { sources = append(sources, source); return nil })
	if err != nil || len(ws) != 2 || strings.Join(sources, ",") != "dns,kubernetes" {
		t.Fatalf("watchers %d, sources %v, err %v; want dns and kubernetes", len(ws), sources, err)
	}
	if ml, _, capTokens := discovery.Defaults(cfg, "kubernetes"); ml != 7 || capTokens != 9000 {
		t.Errorf("kubernetes worker defaults max_load %d capacity %d, want 7 9000", ml, capTokens)
	}
	if ml, _, _ := discovery.Defaults(cfg, "dns"); ml != 3 {
		t.Errorf("dns worker max_load %d, want 3", ml)
	}
	k.Kubeconfig = filepath.Join(t.TempDir(), "missing")
	if _, err := discovery.Watchers(cfg, log, discovery.NewMetrics(prometheus.NewRegistry()),
		func(string) discovery.Sink { return nil }); err == nil || !strings.Contains(err.Error(), "kubeconfig") {
		t.Errorf("missing kubeconfig: %v, want an error naming it", err)
	}
}
