package daemon_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cartrouter/cart/controlplane/cpclient"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/sim"
)

var cartBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "cart-bin")
	if err != nil {
		panic(err)
	}
	cartBin = filepath.Join(dir, "cart")
	out, err := exec.Command("go", "build", "-o", cartBin, "github.com/cartrouter/cart/cli/cart").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build cart: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

type cpProc struct {
	id, api, raft, dir, cfg string
	cmd                     *exec.Cmd
	log                     *bytes.Buffer
}

func (p *cpProc) url() string { return "http://" + p.api }

func (p *cpProc) start(t *testing.T) {
	t.Helper()
	p.log = &bytes.Buffer{}
	p.cmd = exec.Command(cartBin, "controlplane", "-c", p.cfg)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
}

func (p *cpProc) stop(sig syscall.Signal) {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
	p.cmd = nil
}

func startCluster(t *testing.T, workers []string) []*cpProc {
	t.Helper()
	return startClusterWith(t, workers, "")
}

// startClusterWith starts three nodes whose configs end with extra YAML.
func startClusterWith(t *testing.T, workers []string, extra string) []*cpProc {
	t.Helper()
	base := t.TempDir()
	var procs []*cpProc
	for i := 1; i <= 3; i++ {
		p := &cpProc{id: fmt.Sprintf("n%d", i), api: freePort(t), raft: freePort(t), dir: filepath.Join(base, fmt.Sprintf("d%d", i))}
		procs = append(procs, p)
	}
	for i, p := range procs {
		var sb strings.Builder
		fmt.Fprintf(&sb, "server: {min_open_files: 0}\nlog: {level: warn}\nhealth: {interval_secs: 0.5, timeout_secs: 0.4}\n")
		fmt.Fprintf(&sb, "controlplane:\n  node_id: %s\n  api_addr: %s\n  raft_addr: %s\n  data_dir: %s\n  placement_batch_ms: 5\n", p.id, p.api, p.raft, p.dir)
		if i == 0 {
			sb.WriteString("  bootstrap: true\nworkers:\n")
			for _, w := range workers {
				fmt.Fprintf(&sb, "  - url: %s\n", w)
			}
		} else {
			fmt.Fprintf(&sb, "  join: [%s]\n", procs[0].url())
		}
		sb.WriteString(extra)
		p.cfg = filepath.Join(base, p.id+".yaml")
		if err := os.WriteFile(p.cfg, []byte(sb.String()), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	procs[0].start(t)
	waitLeader(t, procs[:1], 10*time.Second)
	procs[1].start(t)
	procs[2].start(t)
	t.Cleanup(func() {
		for _, p := range procs {
			p.stop(syscall.SIGKILL)
		}
		if t.Failed() {
			for _, p := range procs {
				if p.log != nil {
					t.Logf("--- %s log:\n%s", p.id, p.log.String())
				}
			}
		}
	})
	// Every node knows all three voters.
	deadline := time.Now().Add(15 * time.Second)
	for {
		st, err := status(procs[0].url())
		if err == nil && len(st.GetMembers()) == 3 && st.GetLeaderUrl() != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster did not form: %v %v", st, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return procs
}

var client = cpclient.NewWithTLS(nil)

func admin(url string) cartv1connect.AdminServiceClient {
	return cartv1connect.NewAdminServiceClient(client, url, connect.WithGRPC())
}

func routerc(url string) cartv1connect.RouterServiceClient {
	return cartv1connect.NewRouterServiceClient(client, url, connect.WithGRPC())
}

func status(url string) (*cartv1.ClusterStatusResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	r, err := admin(url).ClusterStatus(ctx, connect.NewRequest(&cartv1.ClusterStatusRequest{}))
	if err != nil {
		return nil, err
	}
	return r.Msg, nil
}

// waitLeader waits until some node of procs reports itself leader and
// returns it.
func waitLeader(t *testing.T, procs []*cpProc, within time.Duration) *cpProc {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		for _, p := range procs {
			if p.cmd == nil {
				continue
			}
			if st, err := status(p.url()); err == nil && st.GetState() == "leader" {
				return p
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no leader within %v", within)
	return nil
}

func workerURLs(t *testing.T, url string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	r, err := admin(url).ListWorkers(ctx, connect.NewRequest(&cartv1.ListWorkersRequest{}))
	if err != nil {
		t.Fatalf("list workers via %s: %v", url, err)
	}
	var out []string
	for _, w := range r.Msg.GetWorkers() {
		out = append(out, w.GetUrl())
	}
	return out
}

func replica(t *testing.T, name string) string {
	t.Helper()
	// Serving "m", the model the tests route: the leader routes a model
	// only to workers whose /v1/models lists it.
	s := sim.New(sim.Config{Name: name, Models: []string{"m"}})
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() { ts.Close(); _ = s.Close() })
	return ts.URL
}

// TestLeaderKillAndFullRestart runs three real `cart controlplane`
// processes on raft-boltdb: kill -9 the leader, a new leader answers Route
// within 3 s with the worker set intact; restart all three and every
// acknowledged worker change is still there. The data dirs never contain
// prompt text.
func TestLeaderKillAndFullRestart(t *testing.T) {
	w1, w2, w3 := replica(t, "w1"), replica(t, "w2"), replica(t, "w3")
	procs := startCluster(t, []string{w1, w2})
	leader := waitLeader(t, procs, 10*time.Second)
	ctx := context.Background()

	// Acknowledged admin changes, through a follower (forwarded).
	var follower *cpProc
	for _, p := range procs {
		if p != leader {
			follower = p
			break
		}
	}
	// A follower forwards to the leader's API URL, which a new leader
	// publishes through the log just after winning: until the follower has
	// applied it, the answer is a definite "not done" (Unavailable), and
	// the command is idempotent, so retrying is what a client does.
	testkit.WaitForMsg(t, 10*time.Second, "add worker via follower", func() (bool, string) {
		_, err := admin(follower.url()).AddWorker(ctx, connect.NewRequest(&cartv1.AddWorkerRequest{Worker: &cartv1.Worker{Url: w3, MaxLoad: 7}}))
		if err != nil && connect.CodeOf(err) != connect.CodeUnavailable {
			t.Fatalf("add worker via follower: %v", err)
		}
		return err == nil, fmt.Sprint(err)
	})
	if _, err := admin(leader.url()).RemoveWorker(ctx, connect.NewRequest(&cartv1.RemoveWorkerRequest{Url: w1})); err != nil {
		t.Fatalf("remove worker: %v", err)
	}
	want := []string{w2, w3}

	const secret = "SECRET-PROMPT-TEXT-never-on-disk "
	prompt := strings.Repeat(secret, 40)
	first, err := routerc(leader.url()).Route(ctx, connect.NewRequest(&cartv1.RouteRequest{Text: prompt, Model: "m", DataplaneId: "test"}))
	if err != nil {
		t.Fatal(err)
	}
	// The placement batch must have committed before the kill: wait until
	// every follower has applied it (its own index holds the entry).
	for _, p := range procs {
		if p == leader {
			continue
		}
		testkit.WaitForMsg(t, 10*time.Second, "placement replicated to "+p.id, func() (bool, string) {
			st, err := status(p.url())
			return err == nil && st.GetIndexEntries() > 0, fmt.Sprint(st.GetIndexEntries(), err)
		})
	}

	leader.stop(syscall.SIGKILL)
	killed := time.Now()
	var survivors []*cpProc
	for _, p := range procs {
		if p != leader {
			survivors = append(survivors, p)
		}
	}
	var resp *connect.Response[cartv1.RouteResponse]
	for {
		rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		resp, err = routerc(survivors[0].url()).Route(rctx, connect.NewRequest(&cartv1.RouteRequest{Text: prompt, Model: "m", DryRun: true}))
		cancel()
		if err == nil {
			break
		}
		if time.Since(killed) > 3*time.Second {
			t.Fatalf("no Route answer within 3 s of killing the leader: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("new leader answered Route %v after kill -9 of the old one", time.Since(killed).Round(time.Millisecond))
	if resp.Msg.GetReason() != "cache_hit" || resp.Msg.GetWorker() != first.Msg.GetWorker() {
		t.Fatalf("after failover: %s -> %s, want cache_hit -> %s (the replicated index was lost)", resp.Msg.GetReason(), resp.Msg.GetWorker(), first.Msg.GetWorker())
	}
	if got := workerURLs(t, survivors[0].url()); !equalSets(got, want) {
		t.Fatalf("workers after failover = %v, want %v", got, want)
	}

	// Restart everything: graceful stop of the survivors, then all three up.
	for _, p := range survivors {
		p.stop(syscall.SIGTERM)
	}
	for _, p := range procs {
		p.start(t)
	}
	waitLeader(t, procs, 15*time.Second)
	for _, p := range procs {
		deadline := time.Now().Add(10 * time.Second)
		for {
			got := workerURLs(t, p.url())
			if equalSets(got, want) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after restart %s has workers %v, want %v", p.id, got, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for _, p := range procs {
		p.stop(syscall.SIGTERM)
	}
	// No prompt text in any data dir.
	for _, p := range procs {
		err := filepath.Walk(p.dir, func(path string, info os.FileInfo, err error) error {
			if err != nil || info.IsDir() {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if bytes.Contains(b, []byte("SECRET-PROMPT")) {
				return fmt.Errorf("%s contains prompt text", path)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func equalSets(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]bool{}
	for _, x := range a {
		m[x] = true
	}
	for _, x := range b {
		if !m[x] {
			return false
		}
	}
	return true
}

// TestBufCurl calls the running control plane with a real `buf curl`,
// using reflection only (no schema file), exactly as the README shows.
func TestBufCurl(t *testing.T) {
	buf, err := exec.LookPath("buf")
	if err != nil {
		if p, _ := filepath.Abs("../../.tools/buf"); fileExists(p) {
			buf = p
		} else if os.Getenv("CI") != "" {
			t.Fatal("buf not found: CI must run `make tools` first")
		} else {
			t.Skip("buf not installed (make tools)")
		}
	}
	w := replica(t, "w")
	procs := startCluster(t, []string{w})
	leader := waitLeader(t, procs, 10*time.Second)
	out, err := exec.Command(buf, "curl", "--http2-prior-knowledge", "--data", `{"text":"hello"}`,
		leader.url()+"/cart.v1.RouterService/Route").CombinedOutput()
	if err != nil {
		t.Fatalf("buf curl Route: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), `"worker": "`+w+`"`) || !strings.Contains(string(out), `"reason"`) {
		t.Fatalf("buf curl Route answered:\n%s", out)
	}
	out, err = exec.Command(buf, "curl", "--http2-prior-knowledge", "--list-methods", leader.url()).CombinedOutput()
	if err != nil {
		t.Fatalf("buf curl --list-methods: %v\n%s", err, out)
	}
	for _, m := range []string{"cart.v1.RouterService/Route", "cart.v1.AdminService/AddWorker", "cart.v1.AdminService/ClusterStatus"} {
		if !strings.Contains(string(out), m) {
			t.Fatalf("reflection does not list %s:\n%s", m, out)
		}
	}
	// gRPC health answers through the same port.
	hreq, _ := http.NewRequest(http.MethodGet, leader.url()+"/metrics", nil)
	hresp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	defer hresp.Body.Close()
	var body bytes.Buffer
	_, _ = body.ReadFrom(hresp.Body)
	if !strings.Contains(body.String(), "cart_raft_leader 1") {
		t.Fatalf("leader metrics lack cart_raft_leader 1:\n%.2000s", body.String())
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return !errors.Is(err, os.ErrNotExist)
}
