package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cartrouter/cart/controlplane/cpclient"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/internal/testkit/proc"
	"github.com/cartrouter/cart/sim"
)

// Timing knobs of the environment. The assertions are the issue's; these
// only choose how fast the system under test reacts.
const (
	loadLeaseSecs  = 2   // controlplane.load_lease_secs
	syncIntervalMs = 500 // dataplane.worker_sync_interval_ms (the default)
	// routeTimeoutMs is dataplane.route_timeout_ms. The default (20 ms) is
	// tuned for a dedicated control plane; on a shared 2-core CI runner a
	// scheduling hiccup exceeds it and the request falls back to local
	// routing, which turns a hit-ratio comparison into a measure of CPU
	// contention. Failover is unaffected: a dead leader refuses
	// connections at once, it does not time out.
	routeTimeoutMs = 250
)

// ---------------------------------------------------------------- binaries

func TestMain(m *testing.M) { proc.Main(m) }

// buildBinaries builds cart and cartctl (once per test binary).
func buildBinaries(t *testing.T) (cart, cartctl string) {
	t.Helper()
	return proc.Build(t, "github.com/cartrouter/cart/cli/cart"), proc.Build(t, "github.com/cartrouter/cart/cli/cartctl")
}

// haproxyPath finds haproxy: missing is a skip on a laptop, a failure in CI.
func haproxyPath(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"haproxy", "/usr/sbin/haproxy", "/usr/local/sbin/haproxy"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("haproxy not found and CI is set: the CI image must provide it (apt-get install -y haproxy)")
	}
	t.Skip("haproxy not installed (apt-get install -y haproxy); the e2e cluster test needs it as the L4 balancer")
	return ""
}

// ---------------------------------------------------------------- processes

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// ---------------------------------------------------------------- replicas

type replica struct {
	name string
	s    *sim.Server
	ts   *httptest.Server
	url  string
}

func newReplica(t *testing.T, cfg sim.Config) *replica {
	t.Helper()
	s := sim.New(cfg)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() { _ = s.Close(); ts.Close() })
	return &replica{name: cfg.Name, s: s, ts: ts, url: ts.URL}
}

func urlsOf(rs []*replica) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.url
	}
	return out
}

// ---------------------------------------------------------------- environment

type cpNode struct {
	*proc.Proc
	id, api, raft string
}

func (c *cpNode) url() string { return "http://" + c.api }

// httpNode is a data plane or an all-in-one router.
type httpNode struct {
	*proc.Proc
	id   string
	addr string
}

func (h *httpNode) url() string { return "http://" + h.addr }

type env struct {
	t   *testing.T
	dir string

	fast   []*replica // the pool for the hit-ratio and failover workloads (TimeScale 0)
	extra  *replica   // added with cartctl
	slow   []*replica // streaming replicas (10 ms/token, real time)
	latRep *replica   // the one fast replica of the latency comparison

	cps    []*cpNode
	dps    []*httpNode // dp1..dp4
	aios   []*httpNode // all-in-one routers over fast, the split baseline
	aioLat *httpNode   // all-in-one over latRep only
	epps   []*eppNode  // endpoint pickers asking the control plane, started by the EPP steps
	hp     *proc.Proc
	fe     map[string]string // HAProxy frontend name -> base URL

	cp         *http.Client // h2c client for the control-plane API
	cartBin    string
	cartctlBin string
}

// frontends: HAProxy frontend name -> backend servers, filled in newEnv.
var frontendNames = []string{"dp1", "dp2", "dp4", "split2", "split4"}

func newEnv(t *testing.T) *env {
	t.Helper()
	hap := haproxyPath(t)
	e := &env{t: t, dir: t.TempDir(), cp: cpclient.NewWithTLS(nil), fe: map[string]string{}}
	e.cartBin, e.cartctlBin = buildBinaries(t)

	for _, n := range []string{"a", "b", "c", "d"} {
		e.fast = append(e.fast, newReplica(t, sim.Config{Name: "fast-" + n, BlockTokens: 16, OutputTokens: 4}))
	}
	e.extra = newReplica(t, sim.Config{Name: "extra", BlockTokens: 16, OutputTokens: 4})
	for _, n := range []string{"1", "2", "3"} {
		e.slow = append(e.slow, newReplica(t, sim.Config{Name: "slow-" + n, BlockTokens: 16, OutputTokens: 4,
			DecodeMsPerToken: 10, MaxConcurrency: 16, TimeScale: 1}))
	}
	e.latRep = newReplica(t, sim.Config{Name: "lat", BlockTokens: 16, OutputTokens: 1})

	// Each process is stopped, and its output shown if the test failed,
	// by the cleanup its first start registers.
	e.startControlPlane(t)
	e.startDataPlanes(t)
	e.startAllInOnes(t)
	e.startHAProxy(t, hap)
	return e
}

func (e *env) startControlPlane(t *testing.T) {
	for i := 1; i <= 3; i++ {
		c := &cpNode{id: fmt.Sprintf("n%d", i), api: testkit.FreeAddr(t), raft: testkit.FreeAddr(t)}
		c.Proc = &proc.Proc{Cmd: proc.Cmd{Name: "cp-" + c.id, Path: e.cartBin}}
		e.cps = append(e.cps, c)
	}
	for i, c := range e.cps {
		var sb strings.Builder
		sb.WriteString("server: {min_open_files: 0}\nlog: {level: info, format: text}\n")
		sb.WriteString("health: {interval_secs: 0.5, timeout_secs: 0.4}\n")
		fmt.Fprintf(&sb, "controlplane:\n  node_id: %s\n  api_addr: %s\n  raft_addr: %s\n  data_dir: %s\n",
			c.id, c.api, c.raft, filepath.Join(e.dir, "raft-"+c.id))
		fmt.Fprintf(&sb, "  placement_batch_ms: 5\n  load_lease_secs: %d\n", loadLeaseSecs)
		if i == 0 {
			sb.WriteString("  bootstrap: true\nworkers:\n")
			for _, u := range urlsOf(e.fast) {
				fmt.Fprintf(&sb, "  - url: %s\n", u)
			}
		} else {
			fmt.Fprintf(&sb, "  join: [%s]\n", e.cps[0].url())
		}
		cfg := filepath.Join(e.dir, c.id+".yaml")
		writeFile(t, cfg, sb.String())
		c.Args = []string{"controlplane", "-c", cfg}
	}
	e.cps[0].Start(t)
	e.waitLeader(t, 15*time.Second)
	e.cps[1].Start(t)
	e.cps[2].Start(t)
	testkit.WaitForMsg(t, 20*time.Second, "three voters with a leader", func() (bool, string) {
		st, err := e.status(e.cps[0])
		if err != nil {
			return false, err.Error()
		}
		return len(st.GetMembers()) == 3 && st.GetLeaderUrl() != "" && len(e.listWorkersOrNil()) == len(e.fast),
			fmt.Sprintf("members=%d leader=%q", len(st.GetMembers()), st.GetLeaderUrl())
	})
}

func (e *env) cpURLs() []string {
	out := make([]string, len(e.cps))
	for i, c := range e.cps {
		out[i] = c.url()
	}
	return out
}

func (e *env) startDataPlanes(t *testing.T) {
	for i := 1; i <= 4; i++ {
		d := &httpNode{id: fmt.Sprintf("dp%d", i), addr: testkit.FreeAddr(t)}
		_, port, _ := net.SplitHostPort(d.addr)
		cfg := filepath.Join(e.dir, d.id+".yaml")
		writeFile(t, cfg, fmt.Sprintf(`server: {host: 127.0.0.1, port: %s, min_open_files: 0, shutdown_grace_secs: 1}
log: {level: warn, format: text}
proxy: {add_routed_peer_header: true}
dataplane:
  id: %s
  control_plane: [%s]
  route_timeout_ms: %d
  worker_sync_interval_ms: %d
`, port, d.id, strings.Join(e.cpURLs(), ", "), routeTimeoutMs, syncIntervalMs))
		d.Proc = proc.Start(t, proc.Cmd{Name: d.id, Path: e.cartBin, Args: []string{"dataplane", "-c", cfg}})
		e.dps = append(e.dps, d)
	}
	for _, d := range e.dps {
		e.waitReady(t, d, urlsOf(e.fast))
	}
}

func (e *env) startAllInOnes(t *testing.T) {
	mk := func(id string, workers []string) *httpNode {
		a := &httpNode{id: id, addr: testkit.FreeAddr(t)}
		_, port, _ := net.SplitHostPort(a.addr)
		var sb strings.Builder
		fmt.Fprintf(&sb, "server: {host: 127.0.0.1, port: %s, min_open_files: 0, shutdown_grace_secs: 1}\n", port)
		sb.WriteString("log: {level: warn, format: text}\nproxy: {add_routed_peer_header: true}\n")
		sb.WriteString("health: {interval_secs: 0.5, timeout_secs: 0.4}\nworkers:\n")
		for _, u := range workers {
			fmt.Fprintf(&sb, "  - url: %s\n", u)
		}
		cfg := filepath.Join(e.dir, id+".yaml")
		writeFile(t, cfg, sb.String())
		a.Proc = proc.Start(t, proc.Cmd{Name: id, Path: e.cartBin, Args: []string{"-c", cfg}})
		return a
	}
	for i := 1; i <= 4; i++ {
		e.aios = append(e.aios, mk(fmt.Sprintf("aio%d", i), urlsOf(e.fast)))
	}
	e.aioLat = mk("aio-lat", []string{e.latRep.url})
	for _, a := range append(slices.Clone(e.aios), e.aioLat) {
		e.waitReady(t, a, nil)
	}
}

// startHAProxy runs one HAProxy (mode tcp, roundrobin) with a frontend per
// topology under comparison, so every topology is reached the same way.
func (e *env) startHAProxy(t *testing.T, bin string) {
	backends := map[string][]*httpNode{
		"dp1":    e.dps[:1],
		"dp2":    e.dps[:2],
		"dp4":    e.dps[:4],
		"split2": e.aios[:2],
		"split4": e.aios[:4],
	}
	var sb strings.Builder
	sb.WriteString(`global
  maxconn 4096
defaults
  mode tcp
  timeout connect 2s
  timeout client 60s
  timeout server 60s
  retries 2
  option redispatch
`)
	for _, name := range frontendNames {
		addr := testkit.FreeAddr(t)
		e.fe[name] = "http://" + addr
		fmt.Fprintf(&sb, "frontend fe_%s\n  bind %s\n  default_backend be_%s\n", name, addr, name)
		fmt.Fprintf(&sb, "backend be_%s\n  balance roundrobin\n", name)
		for _, n := range backends[name] {
			fmt.Fprintf(&sb, "  server %s %s check inter 200ms fall 2 rise 1\n", n.id, n.addr)
		}
	}
	cfg := filepath.Join(e.dir, "haproxy.cfg")
	writeFile(t, cfg, sb.String())
	e.hp = proc.Start(t, proc.Cmd{Name: "haproxy", Path: bin, Args: []string{"-f", cfg, "-db"}})
	for _, name := range frontendNames {
		e.hp.WaitFor(t, 15*time.Second, "frontend "+name, proc.HTTPOK(e.fe[name]+"/health"))
	}
}

// waitReady waits for a router's /health (a data plane answers 200 only
// once it has synced a healthy worker set) and, when want is given, for
// its /workers to equal want.
func (e *env) waitReady(t *testing.T, n *httpNode, want []string) {
	t.Helper()
	n.WaitFor(t, 20*time.Second, "ready", func() (bool, string) {
		if ok, last := proc.HTTPOK(n.url() + "/health")(); !ok || want == nil {
			return ok, last
		}
		got, err := routerWorkers(n.url())
		if err != nil {
			return false, err.Error()
		}
		return sameSet(got, want), fmt.Sprint("workers ", got)
	})
}

// ---------------------------------------------------------------- polling

var plain = &http.Client{Timeout: 5 * time.Second}

// routerWorkers reads a router's GET /workers.
func routerWorkers(base string) ([]string, error) {
	resp, err := plain.Get(base + "/workers")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var v struct {
		Workers []struct {
			URL    string   `json:"url"`
			Models []string `json:"models"`
		} `json:"workers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return nil, err
	}
	// A worker is in the pool for a model's requests once its model list
	// is known (read from its /v1/models by the prober right after it is
	// added); the replicas here all serve the requests' model.
	out := make([]string, 0, len(v.Workers))
	for _, w := range v.Workers {
		if len(w.Models) > 0 {
			out = append(out, w.URL)
		}
	}
	return out, nil
}

// fallbacks sums cart_fallback_total (all causes) on a router's /metrics.
func fallbacks(base string) (float64, error) {
	resp, err := plain.Get(base + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "cart_fallback_total") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metrics line %q: %v", line, err)
		}
		sum += v
	}
	return sum, sc.Err()
}

func (e *env) fallbackSum(t *testing.T, nodes []*httpNode) float64 {
	t.Helper()
	var sum float64
	for _, n := range nodes {
		v, err := fallbacks(n.url())
		if err != nil {
			t.Fatalf("%s /metrics: %v", n.id, err)
		}
		sum += v
	}
	return sum
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	sort.Strings(a)
	sort.Strings(b)
	return slices.Equal(a, b)
}

// ---------------------------------------------------------------- control plane API

func (e *env) admin(c *cpNode) cartv1connect.AdminServiceClient {
	return cartv1connect.NewAdminServiceClient(e.cp, c.url(), connect.WithGRPC())
}

func (e *env) status(c *cpNode) (*cartv1.ClusterStatusResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	r, err := e.admin(c).ClusterStatus(ctx, connect.NewRequest(&cartv1.ClusterStatusRequest{}))
	if err != nil {
		return nil, err
	}
	return r.Msg, nil
}

// leaderNow returns the live node reporting itself leader, or nil.
func (e *env) leaderNow() *cpNode {
	for _, c := range e.cps {
		if !c.Running() {
			continue
		}
		if st, err := e.status(c); err == nil && st.GetState() == "leader" {
			return c
		}
	}
	return nil
}

func (e *env) waitLeader(t *testing.T, within time.Duration) *cpNode {
	t.Helper()
	var l *cpNode
	testkit.WaitForMsg(t, within, "a control-plane leader", func() (bool, string) {
		l = e.leaderNow()
		return l != nil, "no node reports leader"
	})
	return l
}

// listWorkers asks the leader (live health and load).
func (e *env) listWorkers(t *testing.T) []*cartv1.Worker {
	t.Helper()
	l := e.waitLeader(t, 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	r, err := e.admin(l).ListWorkers(ctx, connect.NewRequest(&cartv1.ListWorkersRequest{}))
	if err != nil {
		t.Fatalf("ListWorkers via %s: %v", l.id, err)
	}
	return r.Msg.GetWorkers()
}

func (e *env) listWorkersOrNil() []*cartv1.Worker {
	l := e.leaderNow()
	if l == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	r, err := e.admin(l).ListWorkers(ctx, connect.NewRequest(&cartv1.ListWorkersRequest{}))
	if err != nil {
		return nil
	}
	return r.Msg.GetWorkers()
}

// setWorkers makes the worker set exactly want (through the AdminService)
// and waits until every live data plane routes over exactly that set.
func (e *env) setWorkers(t *testing.T, want []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	l := e.waitLeader(t, 10*time.Second)
	var have []string
	for _, w := range e.listWorkers(t) {
		have = append(have, w.GetUrl())
	}
	for _, u := range want {
		if !slices.Contains(have, u) {
			if _, err := e.admin(l).AddWorker(ctx, connect.NewRequest(&cartv1.AddWorkerRequest{Worker: &cartv1.Worker{Url: u}})); err != nil {
				t.Fatalf("add worker %s: %v", u, err)
			}
		}
	}
	for _, u := range have {
		if !slices.Contains(want, u) {
			if _, err := e.admin(l).RemoveWorker(ctx, connect.NewRequest(&cartv1.RemoveWorkerRequest{Url: u})); err != nil {
				t.Fatalf("remove worker %s: %v", u, err)
			}
		}
	}
	for _, d := range e.dps {
		if !d.Running() {
			continue
		}
		testkit.WaitForMsg(t, 10*time.Second, d.id+" worker set", func() (bool, string) {
			got, err := routerWorkers(d.url())
			if err != nil {
				return false, err.Error()
			}
			return sameSet(got, want), fmt.Sprint(got)
		})
	}
}

// cartctl runs the real cartctl binary against every control-plane node
// and returns its stdout; a non-zero exit fails the test.
func (e *env) cartctl(t *testing.T, args ...string) string {
	t.Helper()
	stdout, stderr, code := e.cartctlRun(t, args...)
	if code != 0 {
		t.Fatalf("cartctl %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, stdout, stderr)
	}
	return stdout
}

// cartctlRun runs cartctl and returns its output and exit code.
func (e *env) cartctlRun(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	full := append([]string{"--config=", "--server", strings.Join(e.cpURLs(), ","), "--timeout", "15s"}, args...)
	// The flags above are the whole configuration: none from the
	// environment of whoever runs the tests.
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "CARTCTL_") })
	r := proc.Run(t, proc.Cmd{Path: e.cartctlBin, Args: full, Env: env})
	return r.Stdout, r.Stderr, r.Code
}
