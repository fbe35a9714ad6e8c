package daemon_test

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/discovery/dnstest"
	"github.com/cartrouter/cart/internal/testkit"
)

// recorder is an HTTP endpoint that answers like a worker (health and
// /v1/models) and records the Authorization header of every request, by
// path.
type recorder struct {
	*httptest.Server
	mu   sync.Mutex
	seen []string
}

func newRecorder(t *testing.T) *recorder {
	t.Helper()
	r := &recorder{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.seen = append(r.seen, req.URL.Path+" auth="+req.Header.Get("Authorization"))
		r.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprint(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *recorder) requests() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.seen...)
}

func port(t *testing.T, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(strings.TrimPrefix(addr, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// refused reads cart_discovery_refused_total{source="dns",reason} from a
// node's /metrics.
func refused(n *node, reason string) float64 {
	v, _, _ := testkit.MetricSample(nil, n.url()+"/metrics", fmt.Sprintf(`cart_discovery_refused_total{reason=%q,source="dns"}`, reason))
	return v
}

// Attack #3 of issue 33 on a real control-plane node: SRV records point at
// a process on 127.0.0.1, at the cloud metadata address 169.254.169.254
// and at the node's own API port. With the default settings none becomes a
// worker, none is probed, each refusal is logged and counted, and the node
// idles on past several maintenance passes. With loopback allowed
// (discovery.allowed_networks) the loopback worker is added, but the
// metadata address and the node's own port still are not; the discovered
// worker is probed without the pool's worker key, which the static worker
// gets, until proxy.worker_api_key_sources lists dns.
func TestDiscoveryRefusesLocalAddresses(t *testing.T) {
	static, found := newRecorder(t), newRecorder(t)
	ns := dnstest.Start(t)
	keyFile := filepath.Join(t.TempDir(), "pool-key")
	if err := os.WriteFile(keyFile, []byte("pool-key-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	discovery := func(allowed, sources string) string {
		return fmt.Sprintf(`proxy: {worker_api_key_file: %s, worker_api_key_sources: %s}
cache: {eviction_interval_secs: 0.2}
discovery:
  allowed_networks: %s
  dns: {name: _w._tcp.pool, record_type: SRV, resolver: "%s", min_interval_secs: 0.05, max_interval_secs: 0.1}
`, keyFile, sources, allowed, ns.Addr)
	}
	n := layoutNodes(t, 1, nodeOpts{log: "{level: warn, format: text}", workers: []string{static.URL}, extra: discovery("[]", "[static, admin]")})[0]
	ns.Set(t, "r.pool. 1 IN A 127.0.0.1", "meta.pool. 1 IN A 169.254.169.254",
		"_w._tcp.pool. 1 IN SRV 0 0 "+port(t, found.URL)+" r.pool.",
		"_w._tcp.pool. 1 IN SRV 0 0 80 meta.pool.",
		"_w._tcp.pool. 1 IN SRV 0 0 "+port(t, n.api)+" r.pool.")
	n.Start(t)
	waitLeader(t, []*node{n}, 15*time.Second)

	// Default: loopback (twice: the recorder and the node's own port) and
	// link-local refused, on every answer.
	testkit.WaitFor(t, 15*time.Second, "refusals counted over several answers", func() bool {
		return refused(n, "loopback") >= 6 && refused(n, "link_local") >= 3
	})
	time.Sleep(time.Second) // five maintenance passes, two health rounds
	if ws := workerSources(n.url()); len(ws) != 1 || ws[static.URL] != "static" {
		t.Errorf("workers %v: want only the static one", ws)
	}
	if got := found.requests(); len(got) != 0 {
		t.Errorf("the loopback endpoint was contacted: %v", got)
	}
	for _, want := range []string{"endpoint=http://127.0.0.1:" + port(t, found.URL), "endpoint=http://169.254.169.254:80", "reason=loopback", "reason=link_local"} {
		if !n.Log.Contains(want) {
			t.Errorf("log lacks %q:\n%s", want, n.Log.String())
		}
	}
	testkit.WaitFor(t, 10*time.Second, "the static worker probed with the pool key", func() bool {
		return strings.Contains(strings.Join(static.requests(), "\n"), "/health auth=Bearer pool-key-1")
	})

	// Loopback allowed: the recorder becomes a worker; the metadata address
	// and the node's own API port stay out.
	restart := func(extra string) {
		t.Helper()
		n.Terminate()
		b, err := os.ReadFile(n.cfg)
		if err != nil {
			t.Fatal(err)
		}
		cfg := string(b)
		writeFile(t, n.cfg, cfg[:strings.Index(cfg, "proxy: {")]+extra)
		n.Start(t)
		waitLeader(t, []*node{n}, 15*time.Second)
	}
	restart(discovery("[127.0.0.0/8]", "[static, admin]"))
	testkit.WaitFor(t, 15*time.Second, "the loopback worker discovered", func() bool { return workerSources(n.url())[found.URL] == "dns" })
	testkit.WaitFor(t, 15*time.Second, "the own port and the metadata address refused", func() bool {
		return refused(n, "own_listener") >= 3 && refused(n, "link_local") >= 3
	})
	if ws := workerSources(n.url()); len(ws) != 2 {
		t.Errorf("workers %v: want the static and the discovered one", ws)
	}
	testkit.WaitFor(t, 10*time.Second, "the discovered worker probed", func() bool { return len(found.requests()) >= 2 })
	for _, r := range found.requests() {
		if !strings.HasSuffix(r, " auth=") {
			t.Errorf("the discovered worker got %q: the pool key goes only to trusted sources", r)
		}
	}

	// dns trusted with the pool key: now it gets it.
	restart(discovery("[127.0.0.0/8]", "[static, admin, dns]"))
	testkit.WaitFor(t, 15*time.Second, "the discovered worker probed with the pool key", func() bool {
		return strings.Contains(strings.Join(found.requests(), "\n"), "/health auth=Bearer pool-key-1")
	})
}
