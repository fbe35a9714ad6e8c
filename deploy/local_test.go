package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/cpclient"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/internal/testkit/proc"
)

// TestLocalRunShipsWithAClientKey: `make run` is what newcomers copy, so it
// demonstrates client authentication: run.sh creates the key file the
// config names and prints it in the curl line.
func TestLocalRunShipsWithAClientKey(t *testing.T) {
	cfg, err := config.Load(path(t, "deploy", "local", "cart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Auth.ClientKeys) != 1 || cfg.Auth.ClientKeys[0].KeyFile == "" {
		t.Fatalf("client_keys %v: want one key read from a file", cfg.Auth.ClientKeys)
	}
	keyFile := cfg.Auth.ClientKeys[0].KeyFile
	run := string(readFile(t, "deploy", "local", "run.sh"))
	if !strings.Contains(run, "key_file="+keyFile) || !strings.Contains(run, `-H "Authorization: Bearer $key"`) {
		t.Errorf("run.sh does not create %s or does not print the key in the curl line", keyFile)
	}
	withSecretFiles(cfg, fakeSecrets(t))
	if err := cfg.Validate(config.RoleAllInOne); err != nil {
		t.Fatal(err)
	}
}

// freeBlock picks a base port for which base+off is free for every off: a
// script that derives its ports from one base needs all of them.
func freeBlock(t *testing.T, offs ...int) int {
	t.Helper()
	for range 200 {
		base := 10000 + rand.IntN(20000)
		ok := true
		for _, off := range offs {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+off))
			if err != nil {
				ok = false
				break
			}
			_ = ln.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("no free block of ports")
	return 0
}

// clusterProcs lists the processes of one run-cluster: those whose command
// line names its directory (nodes, data planes, HAProxy) or whose program
// is the cart-sim this test built.
func clusterProcs(dir, cartSim string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if strings.Contains(string(b), dir) || args[0] == cartSim {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestRunCluster runs `make run-cluster`'s script as a newcomer would: the
// cluster comes up behind HAProxy, a prompt sent twice through it is
// routed to the same replica and hits its cache, every file lands in the
// cluster directory, and Ctrl-C (SIGINT) stops every process it started.
func TestRunCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a three-node cluster, two data planes, HAProxy and three replicas")
	}
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc to check that every process stopped")
	}
	haproxy := tool(t, "apt-get install -y haproxy", "/usr/sbin/haproxy", "haproxy")
	tool(t, "apt-get install -y curl", "curl")
	cart, cartSim := proc.Build(t, "github.com/cartrouter/cart/cli/cart"), proc.Build(t, "github.com/cartrouter/cart/cli/cart-sim")
	front := freeBlock(t, 0, 1, 2, 21, 22, 31, 32, 101, 102)
	sims := freeBlock(t, 0, 1, 2)
	dir := filepath.Join(t.TempDir(), "cluster")
	t.Cleanup(func() {
		// Whatever the outcome, nothing of this run may outlive the test.
		for _, pid := range clusterProcs(dir, cartSim) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	env := append(os.Environ(), fmt.Sprintf("CART_PORT=%d", front), fmt.Sprintf("SIM_PORT=%d", sims),
		"CART_CLUSTER_DIR="+dir, "CART="+cart, "CART_SIM="+cartSim, "HAPROXY="+haproxy)
	p := proc.Start(t, proc.Cmd{Name: "cluster.sh", Path: "bash", Args: []string{path(t, "deploy", "local", "cluster.sh")}, Env: env})
	p.WaitFor(t, 90*time.Second, "the cluster to be up behind HAProxy", func() (bool, string) {
		return p.Log.Contains("Ctrl-C stops everything."), "no ready message yet"
	})
	key, err := os.ReadFile(filepath.Join(dir, "client-key"))
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"cart-sim","messages":[{"role":"system","content":"You are a helpful assistant that answers questions about the CART router in detail."},{"role":"user","content":"hello"}]}`
	var peers []string
	for i := range 2 {
		resp, out, err := testkit.PostJSON(t, fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", front), body, "Authorization", "Bearer "+string(key))
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d through HAProxy: %s %v %s", i, resp.Status, err, out)
		}
		var v struct {
			Usage struct {
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatal(err)
		}
		if i == 1 && v.Usage.Details.Cached == 0 {
			t.Errorf("the second identical prompt missed the cache (peers %v, %s)", peers, out)
		}
		peers = append(peers, resp.Header.Get("X-Routed-Peer"))
	}
	if peers[0] == "" || peers[0] != peers[1] {
		t.Errorf("routed to %v: want one replica twice", peers)
	}
	for _, f := range []string{"n1.yaml", "n2.yaml", "n3.yaml", "dp1.yaml", "dp2.yaml", "haproxy.cfg", "cluster-token", "admin-token", "logs/n1.log", "data/n1"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("%s not in the cluster directory: %v", f, err)
		}
	}
	checkRouteDryRun(t, dir, fmt.Sprintf("http://127.0.0.1:%d", front+1))
	if before := len(clusterProcs(dir, cartSim)); before < 9 {
		t.Errorf("%d processes of the cluster running, want 9 (3 nodes, 2 data planes, HAProxy, 3 replicas)", before)
	}

	if err := p.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := p.ExitCode(t, 60*time.Second); code != 130 {
		t.Errorf("cluster.sh exited %d on SIGINT, want 130", code)
	}
	if left := clusterProcs(dir, cartSim); len(left) > 0 {
		t.Errorf("processes left after Ctrl-C: %v\n%s", left, p.Log.Tail(4096))
	}
	for _, port := range []int{front, front + 1, front + 2, front + 21, front + 22, front + 31, front + 32, front + 101, front + 102, sims, sims + 1, sims + 2} {
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
			c.Close()
			t.Errorf("port %d still accepts connections after Ctrl-C", port)
		}
	}
}

// checkRouteDryRun holds docs/distributed.md's word on calling Route by hand: a dry run
// leaves the load as it was; a live decision takes one unit on the chosen
// worker until the stale-ticket sweep frees it, after the load lease (5 s
// by default).
func checkRouteDryRun(t *testing.T, dir, api string) {
	t.Helper()
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	client := cpclient.NewWithTLS(nil)
	defer client.CloseIdleConnections()
	router := cartv1connect.NewRouterServiceClient(client, api, connect.WithGRPC(), connect.WithInterceptors(cpclient.Bearer(read("cluster-token"))))
	admin := cartv1connect.NewAdminServiceClient(client, api, connect.WithGRPC(), connect.WithInterceptors(cpclient.Bearer(read("admin-token"))))
	load := func() map[string]uint32 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := admin.ListWorkers(ctx, connect.NewRequest(&cartv1.ListWorkersRequest{}))
		if err != nil {
			t.Fatalf("ListWorkers: %v", err)
		}
		out := map[string]uint32{}
		for _, w := range r.Msg.GetWorkers() {
			out[w.GetUrl()] = w.GetLoad()
		}
		return out
	}
	route := func(dry bool) string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := router.Route(ctx, connect.NewRequest(&cartv1.RouteRequest{Text: "a prompt sent by hand", DryRun: dry}))
		if err != nil {
			t.Fatalf("Route (dry run %v): %v", dry, err)
		}
		return r.Msg.GetWorker()
	}
	// Settled requests of the workload before leave no load behind.
	testkit.WaitForMsg(t, 15*time.Second, "no load on any worker", func() (bool, string) {
		l := load()
		for _, n := range l {
			if n != 0 {
				return false, fmt.Sprint(l)
			}
		}
		return true, ""
	})
	w := route(true)
	if l := load(); l[w] != 0 {
		t.Errorf("a dry run left load %d on %s", l[w], w)
	}
	start := time.Now()
	w = route(false)
	if l := load(); l[w] != 1 {
		t.Errorf("a live decision left load %d on %s, want 1", l[w], w)
	}
	testkit.WaitForMsg(t, 20*time.Second, "the stale-ticket sweep to free the live decision's load", func() (bool, string) {
		n := load()[w]
		return n == 0, fmt.Sprint("load ", n)
	})
	if held := time.Since(start); held < 4*time.Second {
		t.Errorf("the live decision's load was freed after %v, before the 5 s lease", held)
	} else {
		t.Logf("a live Route held load on %s for %v", w, held.Round(100*time.Millisecond))
	}
}

// The scripts of make run, make run-cluster and make fuzz pass shellcheck.
func TestLocalScriptsPassShellcheck(t *testing.T) {
	sh := tool(t, "apt-get install shellcheck", "shellcheck")
	run(t, repoRoot(t), sh, "deploy/local/run.sh", "deploy/local/cluster.sh", "scripts/fuzz.sh")
}

// TestLocalRunSplit: `make run SPLIT=1` starts the replicas its config
// names, with their roles, and the layered config is valid.
func TestLocalRunSplit(t *testing.T) {
	cfg, err := config.Load(path(t, "deploy", "local", "cart.yaml"), path(t, "deploy", "local", "cart-split.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	run := string(readFile(t, "deploy", "local", "run.sh"))
	for _, w := range cfg.Workers {
		port := w.URL[strings.LastIndexByte(w.URL, ':')+1:]
		if w.Role != "prefill" && w.Role != "decode" {
			t.Errorf("%s: role %q", w.URL, w.Role)
		}
		if !strings.Contains(run, `--listen "127.0.0.1:800$i"`) || !strings.Contains(run, "--pd-role") || !strings.HasPrefix(port, "800") {
			t.Errorf("run.sh does not start %s as a %s replica", w.URL, w.Role)
		}
	}
	if len(cfg.Workers) != 4 || !strings.Contains(run, "for i in 1 2 3 4") || !strings.Contains(run, "deploy/local/cart-split.yaml") {
		t.Errorf("workers %v; run.sh must start four replicas and layer cart-split.yaml", cfg.Workers)
	}
	withSecretFiles(cfg, fakeSecrets(t))
	if err := cfg.Validate(config.RoleAllInOne); err != nil {
		t.Fatal(err)
	}
}
