package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	openaiopt "github.com/openai/openai-go/v3/option"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/cartrouter/cart/dataplane/epp"
	"github.com/cartrouter/cart/dataplane/epp/epptest"
	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/internal/testkit/kubeapi"
	"github.com/cartrouter/cart/internal/testkit/proc"
	"github.com/cartrouter/cart/sim"
	"github.com/cartrouter/cart/sim/simtest"
)

// eppProc is a real `cart epp` process and a gateway in front of it.
type eppProc struct {
	*proc.Proc
	conn    *grpc.ClientConn
	metrics string
	gateway string
	seen    chan epptest.Exchange
}

// startEPP runs `cart epp -c` with yaml (its server and log sections are
// added here), connects to it (TLS with tc), waits until it is ready and
// serves a gateway in front of it.
func startEPP(t *testing.T, yaml string, tc *tls.Config, g *epptest.Gateway) *eppProc {
	t.Helper()
	bin := proc.Build(t, ".")
	port, mport := testkit.FreePort(t), testkit.FreePort(t)
	dir := t.TempDir()
	base, overlay := filepath.Join(dir, "base.yaml"), filepath.Join(dir, "epp.yaml")
	if err := os.WriteFile(base, []byte(fmt.Sprintf("log: {level: info}\nserver:\n  host: 127.0.0.1\n  port: %d\n  min_open_files: 0\n  shutdown_grace_secs: 2\n  metrics_addr: 127.0.0.1:%d\n", port, mport)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(overlay, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	p := proc.Start(t, proc.Cmd{Name: "cart-epp", Path: bin, Args: []string{"epp", "-c", base, "-c", overlay}})
	conn, err := epptest.Dial(fmt.Sprintf("127.0.0.1:%d", port), tc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	p.WaitFor(t, 20*time.Second, "readiness", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return epptest.Ready(ctx, conn)
	})
	if g == nil {
		g = &epptest.Gateway{}
	}
	e := &eppProc{Proc: p, conn: conn, metrics: fmt.Sprintf("http://127.0.0.1:%d/metrics", mport), seen: make(chan epptest.Exchange, 64)}
	g.Conn = conn
	g.Observe = func(ex epptest.Exchange) { e.seen <- ex }
	ts := httptest.NewServer(g)
	t.Cleanup(ts.Close)
	e.gateway = ts.URL
	return e
}

func (e *eppProc) metric(t *testing.T, series string) float64 {
	t.Helper()
	v, _, err := testkit.MetricSample(http.DefaultClient, e.metrics, series)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// stop sends SIGTERM and wants a clean exit.
func (e *eppProc) stop(t *testing.T) {
	t.Helper()
	if err := e.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := e.ExitCode(t, 20*time.Second); code != 0 {
		t.Fatalf("cart epp exited %d after SIGTERM:\n%s", code, e.Log.Tail(4096))
	}
}

func hostPort(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// askThroughGateway sends same-prefix chat requests with the official
// client through the gateway and checks that each was served where the
// picker said (the first of its endpoints answer, as many as wanted),
// found the shared prefix cached after the first.
func askThroughGateway(t *testing.T, e *eppProc, n, endpoints int) {
	t.Helper()
	client := openai.NewClient(openaiopt.WithBaseURL(e.gateway+"/v1/"), openaiopt.WithAPIKey("unused"), openaiopt.WithMaxRetries(0))
	system := strings.Repeat("You are the cart epp process test; be brief. ", 60)
	var first string
	for i := range n {
		resp, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
			Model:    "sim",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(system), openai.UserMessage(fmt.Sprint("question ", i))},
		})
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		ex := <-e.seen
		if ex.Err != nil || ex.Served == "" || ex.Served != strings.Split(ex.Destination, ",")[0] || len(ex.BodyChunks) == 0 ||
			len(strings.Split(ex.Destination, ",")) != endpoints {
			t.Fatalf("request %d: exchange %+v", i, ex)
		}
		for _, c := range ex.BodyChunks {
			if c > epp.MaxChunk {
				t.Fatalf("request %d: a body chunk of %d bytes", i, c)
			}
		}
		if i == 0 {
			first = ex.Served
		} else if ex.Served != first || resp.Usage.PromptTokensDetails.CachedTokens == 0 {
			t.Fatalf("request %d went to %s with %d cached tokens; the first went to %s", i, ex.Served, resp.Usage.PromptTokensDetails.CachedTokens, first)
		}
	}
}

// TestEPPProcess runs `cart epp` (all-in-one, static workers, TLS with
// client certificates, one fallback endpoint, index maintenance every
// 0.2 s) in front of cart-sim replicas: it idles past a maintenance
// cycle, routes the official client's requests (the gateway streams
// bodies to it in 1 KiB chunks) with prefix affinity, releases the load
// of a stream reset in the middle of its answer, and exits cleanly on
// SIGTERM.
func TestEPPProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the cart binary")
	}
	reps := simtest.URLs(t, 3, func(i int) sim.Config {
		return sim.Config{Name: fmt.Sprint("r", i), BlockTokens: 16, OutputTokens: 8, Models: []string{"sim"}}
	})
	dir := t.TempDir()
	ca := testkit.NewCA(t)
	certFile, keyFile := ca.WritePEM(t, dir)
	yaml := fmt.Sprintf("server:\n  tls: {cert_file: %s, key_file: %s, client_ca_file: %s}\ncache: {eviction_interval_secs: 0.2}\nepp: {fallback_endpoints: 1}\nworkers:\n", certFile, keyFile, certFile)
	for _, r := range reps {
		yaml += fmt.Sprintf("  - {url: %s, models: [sim]}\n", r)
	}
	gw := ca.Issue(t, "gateway")
	tc := &tls.Config{RootCAs: ca.Pool, ServerName: "localhost", Certificates: []tls.Certificate{gw}}
	e := startEPP(t, yaml, tc, &epptest.Gateway{ChunkSize: 1024})

	// Without a client certificate the picker is not reachable.
	plain, err := epptest.Dial(strings.TrimPrefix(e.conn.Target(), "dns:///"), &tls.Config{RootCAs: ca.Pool, ServerName: "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(plain).Check(ctx, &healthpb.HealthCheckRequest{Service: "liveness"}); err == nil {
		t.Fatal("a gateway without a client certificate got an answer")
	}

	time.Sleep(600 * time.Millisecond) // past several index maintenance passes
	askThroughGateway(t, e, 4, 2)      // the chosen replica and one fallback

	// A stream reset in the middle of the answer releases its load.
	s, err := epptest.Open(context.Background(), e.conn)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"model":"sim","max_tokens":4,"messages":[{"role":"user","content":"reset me"}]}`)
	if err := s.SendAll(epptest.RequestHeaders("POST", "/v1/chat/completions", "gw", http.Header{"Content-Type": {"application/json"}, "Content-Length": {strconv.Itoa(len(body))}}, false),
		epptest.RequestBody(body, true)); err != nil {
		t.Fatal(err)
	}
	first, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	dest, _ := epptest.Destination(first)
	for {
		m, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if _, eos, _ := epptest.StreamedBody(m.GetRequestBody().GetResponse()); eos {
			break
		}
	}
	primary := "http://" + strings.Split(dest, ",")[0]
	inFlight := `cart_worker_in_flight{worker="` + primary + `"}`
	if got := e.metric(t, inFlight); got != 1 {
		t.Fatalf("%s = %v while the request runs, want 1", inFlight, got)
	}
	if err := s.Send(epptest.ResponseHeaders(200, http.Header{"Content-Type": {"text/event-stream"}}, false, strings.Split(dest, ",")[0])); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	s.Reset()
	e.WaitFor(t, 10*time.Second, "the reset's load released", func() (bool, string) {
		v, gone := e.metric(t, inFlight), e.metric(t, `cart_epp_streams_ended_early_total`)
		return v == 0 && gone == 1, fmt.Sprintf("in flight %v, ended early %v", v, gone)
	})
	e.stop(t)
}

// TestEPPProcessInferencePool runs `cart epp` (all-in-one, h2c) whose
// workers come from an InferencePool (discovery.kubernetes.inference_pool)
// served by a fake API server: the pool's selector picks the pod, each of
// its two target ports (the two replicas) is a worker, requests are routed
// among them, and the process idles past a maintenance cycle and exits
// cleanly.
func TestEPPProcessInferencePool(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the cart binary")
	}
	reps := simtest.URLs(t, 2, func(i int) sim.Config {
		return sim.Config{Name: fmt.Sprint("r", i), BlockTokens: 16, OutputTokens: 8, Models: []string{"sim"}}
	})
	var ports []int
	for _, r := range reps {
		_, p, _ := net.SplitHostPort(hostPort(t, r))
		n, _ := strconv.Atoi(p)
		ports = append(ports, n)
	}
	const ns = "inference"
	api := kubeapi.StartLists(t, ns, map[string]any{
		"/api/v1/namespaces/" + ns + "/pods": kubeapi.PodList(
			kubeapi.ReadyPod("sim-0", ns, "127.0.0.1", map[string]string{"app": "sim"}),
			kubeapi.ReadyPod("other", ns, "127.0.0.2", map[string]string{"app": "other"})),
		"/apis/inference.networking.k8s.io/v1/namespaces/" + ns + "/inferencepools": kubeapi.PoolList("chat", ns, map[string]string{"app": "sim"}, ports...),
	})
	// The pods are on loopback, which discovery refuses unless allowed.
	yaml := fmt.Sprintf("cache: {eviction_interval_secs: 0.2}\ndiscovery:\n  allowed_networks: [127.0.0.0/8]\n  kubernetes: {enabled: true, inference_pool: chat, kubeconfig: %s}\n", api.Kubeconfig(t, t.TempDir()))
	e := startEPP(t, yaml, nil, nil)
	e.WaitLog(t, 10*time.Second, "discovery: worker added")
	time.Sleep(600 * time.Millisecond)
	askThroughGateway(t, e, 3, 1)
	// Each target port is a worker of its own: a subset hint naming it
	// gets it.
	for _, r := range reps {
		if got := pickFrom(t, e.conn, hostPort(t, r)); got != hostPort(t, r) {
			t.Fatalf("subset {%s}: answer %q", hostPort(t, r), got)
		}
	}
	e.stop(t)
}

// pickFrom asks for a destination among subset only, and returns it
// (the stream is then reset: nothing is forwarded).
func pickFrom(t *testing.T, conn *grpc.ClientConn, subset ...string) string {
	t.Helper()
	s, err := epptest.Open(context.Background(), conn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Reset()
	body := []byte(`{"model":"sim","max_tokens":4,"messages":[{"role":"user","content":"which one?"}]}`)
	h := epptest.RequestHeaders("POST", "/v1/chat/completions", "gw", http.Header{"Content-Type": {"application/json"}}, false)
	h.MetadataContext = epptest.Subset(subset...)
	if err := s.SendAll(h, epptest.RequestBody(body, true)); err != nil {
		t.Fatal(err)
	}
	m, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	dest, _ := epptest.Destination(m)
	return dest
}

// `cart epp --config-check` refuses what `cart epp` refuses: no metrics
// listener, too many fallbacks, discovery on a picker that asks a control
// plane; and passes a picker's config.
func TestEPPConfigCheck(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"workers: [{url: http://127.0.0.1:8001}]\n", "server.metrics_addr"},
		{"workers: [{url: http://127.0.0.1:8001}]\nserver: {metrics_addr: 127.0.0.1:9090}\nepp: {fallback_endpoints: 9}\n", "epp.fallback_endpoints"},
		{"server: {metrics_addr: 127.0.0.1:9090}\ndataplane: {control_plane: [http://cp:6701]}\ndiscovery: {kubernetes: {enabled: true, inference_pool: chat}}\n",
			"a data plane does not discover workers"},
	} {
		_, stderr, err := runCart(t, "epp", "-c", writeFile(t, "epp.yaml", c.yaml), "--config-check")
		if err == nil || !strings.Contains(stderr, c.want) {
			t.Errorf("%q: %v\n%s\nwant a problem naming %s", c.yaml, err, stderr, c.want)
		}
	}
	// A config that starts: the start checks (open files, the listener's
	// exposure) pass too.
	out, _, err := runCart(t, "epp", "-c", writeFile(t, "epp.yaml", "server: {host: 127.0.0.1, min_open_files: 0, metrics_addr: 127.0.0.1:9090}\ndataplane: {control_plane: [http://cp:6701]}\nepp: {fallback_endpoints: 2}\n"), "--config-check")
	if err != nil || !strings.Contains(out, "fallback_endpoints: 2") {
		t.Fatalf("a picker's config: %v\n%s", err, out)
	}
}
