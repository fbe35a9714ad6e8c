package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/cpclient"
	"github.com/cartrouter/cart/controlplane/discovery/dnstest"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/internal/testkit/kubeapi"
	"github.com/cartrouter/cart/internal/testkit/proc"
	"github.com/cartrouter/cart/kvevents"
	"github.com/cartrouter/cart/sim"
	"github.com/cartrouter/cart/sim/simtest"
)

// Every role runs as the real cart binary with every boolean switch of
// config.Config on (found by reflection, so a new one is on here the day
// it is added) and the other feature switches set (sessions, hot
// prefixes, capacity, TTL, the daily reset, remote-media policy, KV events
// both ways, DNS and Kubernetes discovery, tracing to an OTLP receiver,
// a metrics listener, every credential), with maintenance intervals short
// enough that the test idles past several passes, before and after one
// request. A switch that panics or stops a process on its first
// maintenance pass (issue 32: session.enabled did, on an empty session
// table) fails here within seconds.

// offForRole lists the boolean switches a role refuses, with why; the test
// checks that Validate does refuse each (so the list cannot hide a switch
// a role accepts).
var offForRole = map[config.Role]map[string]string{
	config.RoleAllInOne: {
		"auth.raft_accept_cluster_token": "the all-in-one router runs no Raft",
	},
	config.RoleDataPlane: {
		"discovery.kubernetes.enabled":   "a data plane does not discover: the control-plane leader does",
		"auth.raft_accept_cluster_token": "a data plane is no Raft peer",
	},
}

// boolKeys lists the dotted keys of every bool in t, "[]" standing for a
// list's items (workers[].…).
func boolKeys(t reflect.Type, prefix string) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		key := name
		if prefix != "" {
			key = prefix + "." + name
		}
		ft := f.Type
		if ft.Kind() == reflect.Slice {
			ft, key = ft.Elem(), key+"[]"
		}
		switch ft.Kind() {
		case reflect.Bool:
			out = append(out, key)
		case reflect.Struct:
			out = append(out, boolKeys(ft, key)...)
		}
	}
	return out
}

// setBools turns on every bool of v (a config struct) except those in off,
// in list items too, and returns the keys it turned on.
func setBools(v reflect.Value, prefix string, off map[string]string) []string {
	var on []string
	t := v.Type()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		key := name
		if prefix != "" {
			key = prefix + "." + name
		}
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Bool:
			if _, skip := off[key]; !skip {
				f.SetBool(true)
				on = append(on, key)
			}
		case reflect.Struct:
			on = append(on, setBools(f, key, off)...)
		case reflect.Slice:
			if f.Type().Elem().Kind() != reflect.Struct {
				continue
			}
			for j := range f.Len() {
				on = append(on, setBools(f.Index(j), key+"[]", off)...)
			}
		}
	}
	return on
}

// featureEnv is what every role's processes talk to: simulated replicas
// (two of them publishing KV events, one dialled and one dialling), a DNS
// server and a Kubernetes API server that each announce one more replica,
// an OTLP receiver, and the credentials.
type featureEnv struct {
	dir                                               string
	static                                            []string  // workers of the config
	kvDialled                                         string    // endpoint of static[0]'s event publisher
	kvListen                                          string    // where the current process binds for static[1]'s publisher to dial
	lateSink                                          *lateSink // static[1]'s events, published once dialEvents connected
	dnsName, dnsResolver, dnsWorker                   string
	kube                                              *kubeapi.Server
	kubeconfig, kubeWorker                            string
	spans                                             *atomic.Int64
	otlp                                              string
	clientKey, token, adminToken                      string
	clientKeyFile, tokenFile, adminKey, raftTokenFile string
	workerKeyFile                                     string
}

const featureModel = "sim"

// lateSink publishes a replica's KV events through a publisher connected
// later, and drops them before: a dialling publisher needs its consumer
// listening first.
type lateSink struct {
	p atomic.Pointer[kvevents.Publisher]
}

func (s *lateSink) Publish(events []kvevents.Event) {
	if p := s.p.Load(); p != nil {
		p.Publish(events)
	}
}

// dialEvents connects static[1]'s publisher to the kv_events.listen of
// the process now running, until the test ends.
func (e *featureEnv) dialEvents(t *testing.T) {
	t.Helper()
	pub, err := kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: e.kvListen, Connect: true, Topic: "static-b"})
	if err != nil {
		t.Fatal(err)
	}
	e.lateSink.p.Store(pub)
	t.Cleanup(func() {
		e.lateSink.p.Store(nil)
		_ = pub.Close()
	})
}

func newFeatureEnv(t *testing.T) *featureEnv {
	t.Helper()
	e := &featureEnv{dir: t.TempDir(), spans: new(atomic.Int64), lateSink: new(lateSink)}
	simCfg := func(name string) sim.Config {
		return sim.Config{Name: name, Models: []string{featureModel}, BlockTokens: 16, OutputTokens: 4}
	}
	// static[0]: CART dials its publisher.
	pub, err := kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Topic: "kv@a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	e.kvDialled = "tcp://" + pub.Addr().String()
	a := simCfg("static-a")
	a.KVEvents = pub
	// static[1]: its publisher dials CART's kv_events.listen once the
	// process has bound it (dialEvents).
	b := simCfg("static-b")
	b.KVEvents = e.lateSink
	e.static = []string{simtest.Start(t, a).URL, simtest.Start(t, b).URL}

	// One replica announced by DNS (SRV: the port comes from the record).
	e.dnsWorker = simtest.Start(t, simCfg("dns")).URL
	_, dnsPort, _ := net.SplitHostPort(strings.TrimPrefix(e.dnsWorker, "http://"))
	dns := dnstest.Start(t)
	e.dnsName, e.dnsResolver = "_w._tcp.pool", dns.Addr
	dns.Set(t, "_w._tcp.pool. 1 IN SRV 0 0 "+dnsPort+" a.pool.", "a.pool. 1 IN A 127.0.0.1")

	// One replica announced by a Service's EndpointSlice.
	e.kubeWorker = simtest.Start(t, simCfg("kube")).URL
	_, kubePort, _ := net.SplitHostPort(strings.TrimPrefix(e.kubeWorker, "http://"))
	var port int32
	fmt.Sscan(kubePort, &port)
	e.kube = kubeapi.Start(t, "inference", "vllm", "http", kubeapi.Endpoint{IP: "127.0.0.1", Port: port})
	e.kubeconfig = e.kube.Kubeconfig(t, e.dir)

	otlp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/traces" {
			e.spans.Add(1)
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(otlp.Close)
	e.otlp = otlp.URL

	secret := func(name, value string) string {
		p := filepath.Join(e.dir, name)
		if err := os.WriteFile(p, []byte(value+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	e.clientKey, e.token, e.adminToken = "client-key-features", "cluster-token-features", "admin-token-features"
	e.clientKeyFile, e.tokenFile, e.adminKey = secret("client-key", e.clientKey), secret("token", e.token), secret("admin-token", e.adminToken)
	e.raftTokenFile = secret("raft-token", "raft-token-for-the-features-test")
	e.workerKeyFile = secret("worker-key", "worker-key-features")
	return e
}

// config builds role's config with every feature on, listening on the
// addresses given (api and raft for a control plane, port for a proxy).
func (e *featureEnv) config(t *testing.T, role config.Role, port int, metricsAddr, cpID, api, raft string, cps []string) *config.Config {
	t.Helper()
	c := config.Default()
	c.Server.Host, c.Server.Port, c.Server.MinOpenFiles, c.Server.ShutdownGraceSecs = "127.0.0.1", port, 0, 1
	c.Server.MetricsAddr = metricsAddr
	c.Log.Format = "text"
	// Maintenance and probing, fast: the test idles past several passes.
	c.Cache.EvictionIntervalSecs = 0.2
	c.Cache.CapacityTokens, c.Cache.TTLSecs, c.Cache.HotPrefixFraction = 1<<20, 30, 0.5
	c.Cache.DailyCleanupHourUTC = time.Now().UTC().Hour() // due at the first pass
	c.Health.IntervalSecs, c.Health.TimeoutSecs = 0.2, 0.2
	c.Session.TTLSecs = 0.5 // sessions set by the request expire while idling after it
	c.Responses.AffinityTTLSecs = 0.5
	c.Proxy.RemoteMediaURLPolicy = http.StatusForbidden
	c.Proxy.WorkerAPIKeyFile = e.workerKeyFile
	c.Auth.TokenFile, c.Auth.AdminTokenFile = e.tokenFile, e.adminKey
	c.Auth.ClientKeys = []config.ClientKey{{Name: "features", KeyFile: e.clientKeyFile}}
	c.Tracing.OTLPEndpoint, c.Tracing.SampleRatio = e.otlp, 1
	c.ControlPlane.SlowLeaderHandover.WindowSecs, c.ControlPlane.SlowLeaderHandover.MinIntervalSecs = 1, 1
	if role != config.RoleDataPlane {
		for _, u := range e.static {
			c.Workers = append(c.Workers, config.Worker{URL: u, Models: []string{featureModel}})
		}
		c.Workers[0].KVEvents = config.WorkerKVEvents{Endpoint: e.kvDialled}
		c.Workers[1].KVEvents = config.WorkerKVEvents{Topic: "static-b"}
		e.kvListen = "tcp://" + testkit.FreeAddr(t)
		c.KVEvents.Listen = e.kvListen
		d := &c.Discovery
		d.DrainTimeoutSecs = 1
		d.DNS.Name, d.DNS.RecordType, d.DNS.Resolver = e.dnsName, "SRV", e.dnsResolver
		d.DNS.MinIntervalSecs, d.DNS.MaxIntervalSecs = 0.2, 1
		d.Kubernetes.Service, d.Kubernetes.Namespace, d.Kubernetes.Port, d.Kubernetes.Kubeconfig = "vllm", e.kube.Namespace, "http", e.kubeconfig
		d.Kubernetes.MinIntervalSecs = 0.2
		// The test's DNS and Kubernetes answers name loopback workers,
		// which discovery refuses unless allowed.
		d.AllowedNetworks = []string{"127.0.0.0/8"}
	}
	switch role {
	case config.RoleControlPlane:
		cp := &c.ControlPlane
		cp.NodeID, cp.APIAddr, cp.RaftAddr, cp.DataDir = cpID, api, raft, filepath.Join(e.dir, "raft-"+cpID)
		cp.PlacementBatchMs, cp.LoadLeaseSecs = 5, 1
		c.Auth.RaftTokenFile = e.raftTokenFile
	case config.RoleDataPlane:
		dp := &c.DataPlane
		dp.ID, dp.ControlPlane = "dp-features", cps
		dp.WorkerSyncIntervalMs, dp.ReportIntervalMs = 50, 10
		dp.RouteTimeoutMs = 250 // a loaded 2-core box must not turn the request into a fallback
	}
	on := setBools(reflect.ValueOf(c).Elem(), "", offForRole[role])
	t.Logf("%v: switches on: %s", role, strings.Join(on, " "))
	if err := c.Validate(role); err != nil {
		t.Fatalf("%v config with every feature on: %v", role, err)
	}
	return c
}

// write renders cfg to a file, as an operator's would be.
func (e *featureEnv) write(t *testing.T, name string, cfg *config.Config) string {
	t.Helper()
	b, err := cfg.YAML()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(e.dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// start runs the cart binary with args, the batch span exporter flushing
// every 100 ms so that the receiver sees spans within the test.
func (e *featureEnv) start(t *testing.T, name string, args ...string) *proc.Proc {
	t.Helper()
	env := append(os.Environ(), "OTEL_BSP_SCHEDULE_DELAY=100")
	return proc.Start(t, proc.Cmd{Name: name, Path: proc.Build(t, "."), Args: args, Env: env})
}

// maintainPasses reads how many locked maintenance steps the routing core
// of the process serving /metrics at url has run.
func maintainPasses(url string) (float64, error) {
	v, _, err := testkit.MetricSample(nil, url, `cart_decider_lock_hold_seconds_count{op="maintain"}`)
	return v, err
}

// idlePastMaintenance waits, with p left alone, until its routing core
// has run maintenance steps at least twice more (a whole pass began and
// ended after the wait started) and at least min has passed; p must stay
// up throughout.
func idlePastMaintenance(t *testing.T, p *proc.Proc, metricsURL string, min time.Duration) {
	t.Helper()
	start := time.Now()
	var base float64
	p.WaitFor(t, 20*time.Second, "a first maintenance count", func() (bool, string) {
		v, err := maintainPasses(metricsURL)
		base = v
		return err == nil, fmt.Sprint(err)
	})
	p.WaitFor(t, 30*time.Second, "maintenance passes while idle", func() (bool, string) {
		v, err := maintainPasses(metricsURL)
		if err != nil {
			return false, err.Error()
		}
		return v >= base+2 && time.Since(start) >= min, fmt.Sprintf("maintenance steps %v, %v at start, %v idle", v, base, time.Since(start).Round(time.Millisecond))
	})
}

// checkStops stops p with SIGTERM and requires a clean exit.
func checkStops(t *testing.T, p *proc.Proc) {
	t.Helper()
	if !p.Running() {
		t.Fatalf("%s is not running:\n%s", p.Name, p.Log.Tail(4096))
	}
	p.Terminate()
	if code := p.ExitCode(t, time.Second); code != 0 {
		t.Errorf("%s exited with %d after SIGTERM:\n%s", p.Name, code, p.Log.Tail(4096))
	}
}

// workerSources reads a proxy's /workers (with the admin token): URL ->
// source.
func (e *featureEnv) workerSources(base string) (map[string]string, error) {
	req, _ := http.NewRequest(http.MethodGet, base+"/workers", nil)
	req.Header.Set("Authorization", "Bearer "+e.adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var v struct {
		Workers []struct{ URL, Source string } `json:"workers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return nil, fmt.Errorf("/workers: %s: %w", resp.Status, err)
	}
	out := map[string]string{}
	for _, w := range v.Workers {
		out[w.URL] = w.Source
	}
	return out, nil
}

// waitDiscovered waits until the proxy at base lists the static workers
// and the two discovered ones with their sources.
func (e *featureEnv) waitDiscovered(t *testing.T, p *proc.Proc, base string) {
	t.Helper()
	p.WaitFor(t, 30*time.Second, "static, dns and kubernetes workers in /workers", func() (bool, string) {
		got, err := e.workerSources(base)
		if err != nil {
			return false, err.Error()
		}
		return got[e.static[0]] == "static" && got[e.static[1]] == "static" && got[e.dnsWorker] == "dns" && got[e.kubeWorker] == "kubernetes",
			fmt.Sprint(got)
	})
}

// proxyRequests sends one routed request with a session (200), and one
// with a remote image URL, which the media policy refuses (403).
func (e *featureEnv) proxyRequests(t *testing.T, base string) {
	t.Helper()
	system := strings.Repeat("You are the feature test's assistant. ", 20)
	body := fmt.Sprintf(`{"model":%q,"user":"u-1","messages":[{"role":"system","content":%q},{"role":"user","content":"hello"}]}`, featureModel, system)
	resp, out, err := testkit.PostJSON(t, base+"/v1/chat/completions", body, "Authorization", "Bearer "+e.clientKey, "X-Session-Id", "s-1")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("chat completion: %v %v %s", resp.Status, err, out)
	}
	if peer := resp.Header.Get("X-Routed-Peer"); peer == "" {
		t.Errorf("no X-Routed-Peer with proxy.add_routed_peer_header on")
	}
	media := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://169.254.169.254/x.png"}}]}]}`, featureModel)
	if resp, out, _ := testkit.PostJSON(t, base+"/v1/chat/completions", media, "Authorization", "Bearer "+e.clientKey); resp.StatusCode != http.StatusForbidden {
		t.Errorf("remote media URL: %s %s, want 403 (proxy.remote_media_url_policy)", resp.Status, out)
	}
}

// waitSpans waits for the OTLP receiver to get spans beyond before.
func (e *featureEnv) waitSpans(t *testing.T, p *proc.Proc, before int64) {
	t.Helper()
	p.WaitFor(t, 15*time.Second, "spans exported to the OTLP receiver", func() (bool, string) {
		n := e.spans.Load()
		return n > before, fmt.Sprint(n, " exports")
	})
}

func TestEveryBoolSwitchIsOnOrRefused(t *testing.T) {
	keys := boolKeys(reflect.TypeOf(config.Config{}), "")
	if len(keys) < 10 {
		t.Fatalf("found %d bool switches by reflection: %v; the walk is broken", len(keys), keys)
	}
	for role, off := range offForRole {
		for key, why := range off {
			if !slices.Contains(keys, key) {
				t.Errorf("%v: %s is listed as off (%s) but is no bool of config.Config", role, key, why)
				continue
			}
			// The role must refuse it: a switch it accepts is on in the
			// process test.
			c := config.Default()
			c.DataPlane.ControlPlane = []string{"http://127.0.0.1:6701"}
			c.ControlPlane.NodeID, c.ControlPlane.DataDir = "n1", t.TempDir()
			c.Workers = []config.Worker{{URL: "http://127.0.0.1:8001"}}
			if err := c.Validate(role); err != nil {
				t.Fatalf("%v: the base config is refused: %v", role, err)
			}
			setBools(reflect.ValueOf(c).Elem(), "", mapWithout(keys, key))
			if err := c.Validate(role); err == nil || !strings.Contains(err.Error(), key) {
				t.Errorf("%v: %s is listed as refused (%s) but Validate says %v", role, key, why, err)
			}
		}
	}
}

// mapWithout is a set of every key but keep.
func mapWithout(keys []string, keep string) map[string]string {
	m := map[string]string{}
	for _, k := range keys {
		if k != keep {
			m[k] = ""
		}
	}
	return m
}

func TestEveryFeatureOnEachRole(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the cart binary in every role")
	}
	e := newFeatureEnv(t)

	t.Run("all-in-one", func(t *testing.T) {
		port, metrics := testkit.FreePort(t), testkit.FreeAddr(t)
		cfg := e.write(t, "all-in-one.yaml", e.config(t, config.RoleAllInOne, port, metrics, "", "", "", nil))
		p := e.start(t, "all-in-one", "-c", cfg)
		base, metricsURL := fmt.Sprintf("http://127.0.0.1:%d", port), "http://"+metrics+"/metrics"
		p.WaitFor(t, 30*time.Second, "healthy", proc.HTTPOK(base+"/health"))
		e.dialEvents(t)
		idlePastMaintenance(t, p, metricsURL, 0) // an empty index and session table
		e.waitDiscovered(t, p, base)
		spans := e.spans.Load()
		e.proxyRequests(t, base)
		e.waitSpans(t, p, spans)
		// Past the session and response TTLs: the tables expire what the
		// request put there.
		idlePastMaintenance(t, p, metricsURL, time.Second)
		p.WaitFor(t, 5*time.Second, "healthy after idling", proc.HTTPOK(base+"/health"))
		checkStops(t, p)
	})

	t.Run("controlplane+dataplane", func(t *testing.T) {
		api, raft := testkit.FreeAddr(t), testkit.FreeAddr(t)
		cpCfg := e.write(t, "cp.yaml", e.config(t, config.RoleControlPlane, testkit.FreePort(t), "", "n1", api, raft, nil))
		cp := e.start(t, "controlplane", "controlplane", "-c", cpCfg)
		cpMetrics := "http://" + api + "/metrics"
		client := cpclient.NewWithTLS(nil)
		defer client.CloseIdleConnections()
		router := cartv1connect.NewRouterServiceClient(client, "http://"+api, connect.WithGRPC(), connect.WithInterceptors(cpclient.Bearer(e.token)))
		admin := cartv1connect.NewAdminServiceClient(client, "http://"+api, connect.WithGRPC(), connect.WithInterceptors(cpclient.Bearer(e.adminToken)))
		cp.WaitFor(t, 30*time.Second, "leader with the static and discovered workers", func() (bool, string) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			r, err := admin.ListWorkers(ctx, connect.NewRequest(&cartv1.ListWorkersRequest{}))
			if err != nil {
				return false, err.Error()
			}
			got := map[string]string{}
			for _, w := range r.Msg.GetWorkers() {
				got[w.GetUrl()] = w.GetSource()
			}
			return got[e.static[0]] == "static" && got[e.dnsWorker] == "dns" && got[e.kubeWorker] == "kubernetes", fmt.Sprint(got)
		})
		e.dialEvents(t)
		idlePastMaintenance(t, cp, cpMetrics, 0)

		// One decision with a session, straight to the leader.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r, err := router.Route(ctx, connect.NewRequest(&cartv1.RouteRequest{Model: featureModel, Text: "hello features", SessionKey: "s-cp"}))
		cancel()
		if err != nil || r.Msg.GetWorker() == "" {
			t.Fatalf("Route: %v %v", r, err)
		}

		port, metrics := testkit.FreePort(t), testkit.FreeAddr(t)
		dpCfg := e.write(t, "dp.yaml", e.config(t, config.RoleDataPlane, port, metrics, "", "", "", []string{"http://" + api}))
		dp := e.start(t, "dataplane", "dataplane", "-c", dpCfg)
		base := fmt.Sprintf("http://127.0.0.1:%d", port)
		dp.WaitFor(t, 30*time.Second, "healthy (synced)", proc.HTTPOK(base+"/health"))
		e.waitDiscovered(t, dp, base) // the leader's worker set, synced
		spans := e.spans.Load()
		e.proxyRequests(t, base)
		e.waitSpans(t, dp, spans)
		// The leader keeps maintaining (sessions set by both requests
		// expire) while the data plane keeps syncing.
		idlePastMaintenance(t, cp, cpMetrics, time.Second)
		dp.WaitFor(t, 5*time.Second, "healthy after idling", proc.HTTPOK(base+"/health"))
		if !cp.Running() {
			t.Fatalf("control plane stopped:\n%s", cp.Log.Tail(4096))
		}
		checkStops(t, dp)
		checkStops(t, cp)
	})
}
