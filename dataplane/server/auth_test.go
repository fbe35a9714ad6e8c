package server_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/discovery/dnstest"
	"github.com/cartrouter/cart/dataplane/server"
	"github.com/cartrouter/cart/internal/testkit"
)

// keyedReplica demands its own key (vLLM --api-key) on every path, health
// included, and records the credentials it was sent.
type keyedReplica struct {
	*httptest.Server
	mu   sync.Mutex
	key  string
	seen []string // "path auth=... x-api-key=..."
}

func newKeyedReplica(t *testing.T, key string) *keyedReplica {
	t.Helper()
	k := &keyedReplica{key: key}
	k.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		k.mu.Lock()
		k.seen = append(k.seen, r.URL.Path+" auth="+r.Header.Get("Authorization")+" x-api-key="+r.Header.Get("X-Api-Key"))
		want := "Bearer " + k.key
		k.mu.Unlock()
		if r.Header.Get("Authorization") != want {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}))
	t.Cleanup(k.Close)
	return k
}

func (k *keyedReplica) setKey(key string) {
	k.mu.Lock()
	k.key = key
	k.mu.Unlock()
}

func (k *keyedReplica) requests() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.seen...)
}

func post(t testing.TB, url, body string, hdr ...string) (int, string) {
	t.Helper()
	resp, b, _ := testkit.PostJSON(t, url, body, hdr...)
	return resp.StatusCode, b
}

// TestAllInOneClientAndWorkerKeysFromConfig: client keys and worker keys
// from files, end to end: a client needs its key, the worker gets its own
// key instead, health probes carry it too, and a SIGHUP reload that points
// the worker at a new key file takes effect for requests and probes.
func TestAllInOneClientAndWorkerKeysFromConfig(t *testing.T) {
	dir := t.TempDir()
	clientKey, workerKey := filepath.Join(dir, "client"), filepath.Join(dir, "worker")
	writeFile(t, clientKey, "client-secret-1\n")
	writeFile(t, workerKey, "worker-secret-1\n")
	w := newKeyedReplica(t, "worker-secret-1")
	authYAML := "auth:\n  client_keys:\n    - {name: team-a, key_file: " + clientKey + "}\n"
	paths := configFiles(t, workersYAML(w.URL+";api_key_file: "+workerKey)+authYAML)
	a := newAllInOne(t, paths)
	base := serveHTTP(t, a)

	body := chatBody("sys", "hello", false, 1)
	if code, resp := post(t, base+"/v1/chat/completions", body); code != http.StatusUnauthorized {
		t.Fatalf("without a key: %d %s", code, resp)
	}
	if n := len(w.requests()); n != 0 {
		t.Fatalf("an unauthenticated request reached the worker: %v", w.requests())
	}
	if code, resp := post(t, base+"/v1/chat/completions", body, "Authorization", "Bearer client-secret-1"); code != http.StatusOK {
		t.Fatalf("with the client key: %d %s", code, resp)
	}
	a.Health.Round(context.Background())
	for _, r := range w.requests() {
		if r != "/v1/chat/completions auth=Bearer worker-secret-1 x-api-key=" && r != "/health auth=Bearer worker-secret-1 x-api-key=" &&
			r != "/v1/models auth=Bearer worker-secret-1 x-api-key=" {
			t.Fatalf("worker saw %q", r)
		}
	}
	if got := w.requests(); len(got) != 3 {
		t.Fatalf("worker requests: %v, want the chat, one probe and one model list", got)
	}

	// Rotate the worker key: new file, SIGHUP.
	rotated := filepath.Join(dir, "worker2")
	writeFile(t, rotated, "worker-secret-2")
	w.setKey("worker-secret-2")
	writeFile(t, paths[1], workersYAML(w.URL+";api_key_file: "+rotated)+authYAML)
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	if code, resp := post(t, base+"/v1/chat/completions", body, "X-Api-Key", "client-secret-1"); code != http.StatusOK {
		t.Fatalf("after rotation: %d %s", code, resp)
	}
	a.Health.Round(context.Background())
	got := w.requests()
	if last := got[len(got)-2:]; last[0] != "/health auth=Bearer worker-secret-2 x-api-key=" || last[1] != "/v1/models auth=Bearer worker-secret-2 x-api-key=" {
		t.Fatalf("probes after rotation: %q", last)
	}
}

// addrListener reports a chosen address while really listening on loopback,
// so the exposure check can be driven without binding a public interface.
type addrListener struct {
	net.Listener
	addr net.Addr
}

func (l addrListener) Addr() net.Addr { return l.addr }

// TestRefusesRemoteBindWithoutClientKeys: a proxy on a non-loopback address
// without client keys does not start unless told to.
func TestRefusesRemoteBindWithoutClientKeys(t *testing.T) {
	w := newReplica(t, "w")
	public := &net.TCPAddr{IP: net.ParseIP("0.0.0.0"), Port: 6700}
	for _, tt := range []struct {
		name    string
		extra   string
		refused bool
	}{
		{"no keys", "", true},
		{"explicit opt-in", "auth: {allow_unauthenticated_remote: true}\n", false},
		{"client keys", "auth: {client_keys: [{name: a, key: k-0123456789}]}\n", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := newAllInOne(t, configFiles(t, workersYAML(w.URL)+tt.extra))
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() { errc <- a.Run(ctx, addrListener{ln, public}) }()
			if tt.refused {
				select {
				case err := <-errc:
					cancel()
					if !errors.Is(err, server.ErrUnauthenticatedRemote) {
						t.Fatalf("Run = %v, want ErrUnauthenticatedRemote", err)
					}
				case <-time.After(10 * time.Second):
					cancel()
					t.Fatal("Run served a public address without client keys")
				}
				return
			}
			base := "http://" + ln.Addr().String()
			testkit.WaitFor(t, 10*time.Second, "the router to serve", func() bool {
				resp, err := http.Get(base + "/health")
				if err != nil {
					return false
				}
				resp.Body.Close()
				return resp.StatusCode == http.StatusOK
			})
			cancel()
			if err := <-errc; err != nil {
				t.Fatalf("Run: %v", err)
			}
		})
	}
	// The data plane runs the same check.
	cfg := config.Default()
	cfg.DataPlane.ControlPlane = []string{"http://127.0.0.1:1"}
	if err := server.CheckExposure(cfg, public, discardLogger()); !errors.Is(err, server.ErrUnauthenticatedRemote) {
		t.Fatalf("CheckExposure(0.0.0.0) = %v", err)
	}
	if err := server.CheckExposure(cfg, &net.TCPAddr{IP: net.IPv6loopback, Port: 1}, discardLogger()); err != nil {
		t.Fatalf("CheckExposure([::1]) = %v", err)
	}
}

// TestMetricsOnOwnListener: with server.metrics_addr, /metrics is served
// there and no longer on the client listener.
func TestMetricsOnOwnListener(t *testing.T) {
	w := newReplica(t, "w")
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := probe.Addr().String()
	probe.Close()
	a := newAllInOne(t, configFiles(t, workersYAML(w.URL)+"server: {metrics_addr: \""+metricsAddr+"\"}\n"))
	base := runAllInOne(t, a)
	var body string
	testkit.WaitFor(t, 10*time.Second, "the metrics listener", func() bool {
		resp, err := http.Get("http://" + metricsAddr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return resp.StatusCode == http.StatusOK
	})
	if !strings.Contains(body, "cart_requests_total") && !strings.Contains(body, "cart_index_entries") {
		t.Fatalf("metrics listener body lacks cart_ metrics: %.200s", body)
	}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || w.chats.Load() != 0 {
		t.Fatalf("client listener /metrics: %d (worker hits %d), want 404", resp.StatusCode, w.chats.Load())
	}
}

// The all-in-one router's health probes carry the pool's worker key to its
// static workers, but not to a worker DNS discovery found: discovery
// sources are trusted with it only when proxy.worker_api_key_sources lists
// them.
func TestAllInOneProbesSendPoolKeyByTrustedSource(t *testing.T) {
	dir := t.TempDir()
	pool := filepath.Join(dir, "pool")
	writeFile(t, pool, "pool-secret\n")
	static, found := newKeyedReplica(t, "pool-secret"), newKeyedReplica(t, "pool-secret")
	ns := dnstest.Start(t)
	ns.Set(t, "r.pool. 1 IN A 127.0.0.1", "_w._tcp.pool. 1 IN SRV 0 0 "+found.URL[strings.LastIndex(found.URL, ":")+1:]+" r.pool.")
	a := newAllInOne(t, configFiles(t, workersYAML(static.URL)+discoveryYAML(ns.Addr)+"proxy: {worker_api_key_file: "+pool+"}\n"))
	base := runAllInOne(t, a)
	testkit.WaitFor(t, 10*time.Second, "the replica discovered", func() bool { return workers(t, base)[found.URL].Source == "dns" })
	a.Health.Round(context.Background())
	if got := static.requests(); !slices.Contains(got, "/health auth=Bearer pool-secret x-api-key=") {
		t.Errorf("static worker saw %q, want a probe with the pool key", got)
	}
	got := found.requests()
	if !slices.Contains(got, "/health auth= x-api-key=") {
		t.Errorf("discovered worker saw %q, want a probe without a key", got)
	}
	for _, r := range got {
		if strings.Contains(r, "pool-secret") {
			t.Errorf("the discovered worker got the pool key: %q", r)
		}
	}
}
