package daemon_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/internal/testkit/proc"
)

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

// TestLeaderKillAndFullRestart runs three real `cart controlplane`
// processes on their default log store (raft-wal): kill -9 the leader, a new leader answers Route
// within 3 s with the worker set intact; restart all three and every
// acknowledged worker change is still there. The data dirs never contain
// prompt text.
func TestLeaderKillAndFullRestart(t *testing.T) {
	w1, w2, w3 := replica(t, "w1"), replica(t, "w2"), replica(t, "w3")
	procs := startCluster(t, []string{w1, w2}, "")
	leader := waitLeader(t, procs, 10*time.Second)
	ctx := context.Background()

	// Acknowledged admin changes, through a follower (forwarded).
	var follower *node
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

	leader.Kill()
	killed := time.Now()
	var survivors []*node
	for _, p := range procs {
		if p != leader {
			survivors = append(survivors, p)
		}
	}
	var resp *connect.Response[cartv1.RouteResponse]
	testkit.WaitForMsg(t, 3*time.Second-time.Since(killed), "a Route answer within 3 s of killing the leader", func() (bool, string) {
		rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		resp, err = routerc(survivors[0].url()).Route(rctx, connect.NewRequest(&cartv1.RouteRequest{Text: prompt, Model: "m", DryRun: true}))
		return err == nil, fmt.Sprint(err)
	})
	t.Logf("new leader answered Route %v after kill -9 of the old one", time.Since(killed).Round(time.Millisecond))
	if resp.Msg.GetReason() != "cache_hit" || resp.Msg.GetWorker() != first.Msg.GetWorker() {
		t.Fatalf("after failover: %s -> %s, want cache_hit -> %s (the replicated index was lost)", resp.Msg.GetReason(), resp.Msg.GetWorker(), first.Msg.GetWorker())
	}
	if got := workerURLs(t, survivors[0].url()); !equalSets(got, want) {
		t.Fatalf("workers after failover = %v, want %v", got, want)
	}

	// Restart everything: graceful stop of the survivors, then all three up.
	for _, p := range survivors {
		p.Terminate()
	}
	for _, p := range procs {
		p.Start(t)
	}
	waitLeader(t, procs, 15*time.Second)
	waitWorkers(t, procs, want, "the acknowledged workers after restart")
	for _, p := range procs {
		p.Terminate()
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

// waitWorkers waits until every node lists exactly want as its workers.
func waitWorkers(t *testing.T, nodes []*node, want []string, what string) {
	t.Helper()
	for _, n := range nodes {
		n.WaitFor(t, 10*time.Second, what, func() (bool, string) {
			got := workerURLs(t, n.url())
			return equalSets(got, want), fmt.Sprint(got)
		})
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
// using reflection only (no schema file), exactly as docs/distributed.md shows.
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
	procs := startCluster(t, []string{w}, "")
	leader := waitLeader(t, procs, 10*time.Second)
	r := proc.Run(t, proc.Cmd{Path: buf, Args: []string{"curl", "--http2-prior-knowledge", "--data", `{"text":"hello"}`,
		leader.url() + "/cart.v1.RouterService/Route"}})
	if r.Code != 0 || !strings.Contains(r.Output, `"worker": "`+w+`"`) || !strings.Contains(r.Output, `"reason"`) {
		t.Fatalf("buf curl Route: exit %d:\n%s", r.Code, r.Output)
	}
	r = proc.Run(t, proc.Cmd{Path: buf, Args: []string{"curl", "--http2-prior-knowledge", "--list-methods", leader.url()}})
	if r.Code != 0 {
		t.Fatalf("buf curl --list-methods: exit %d\n%s", r.Code, r.Output)
	}
	for _, m := range []string{"cart.v1.RouterService/Route", "cart.v1.AdminService/AddWorker", "cart.v1.AdminService/ClusterStatus"} {
		if !strings.Contains(r.Output, m) {
			t.Fatalf("reflection does not list %s:\n%s", m, r.Output)
		}
	}
	// /metrics answers through the same port, and names this node leader.
	if v, ok, err := testkit.MetricSample(nil, leader.url()+"/metrics", "cart_raft_leader"); err != nil || !ok || v != 1 {
		t.Fatalf("leader's cart_raft_leader = %v (present %v, error %v), want 1", v, ok, err)
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return !errors.Is(err, os.ErrNotExist)
}

// A three-node cluster on bolt (as upgraded nodes are) is stopped, two of
// its nodes move to the WAL with `cart controlplane migrate-log`, and it
// restarts as a mixed cluster (two WALs, one bolt) that holds every
// acknowledged worker change and still commits new ones.
func TestMigrateLogOfARealCluster(t *testing.T) {
	w1, w2, w3 := replica(t, "w1"), replica(t, "w2"), replica(t, "w3")
	const bolt = "  log_store: bolt\n"
	nodes := startNodes(t, 3, nodeOpts{cp: bolt, workers: []string{w1, w2}})
	leader := waitLeader(t, nodes, 10*time.Second)
	if _, err := leader.admin().AddWorker(context.Background(), connect.NewRequest(&cartv1.AddWorkerRequest{Worker: &cartv1.Worker{Url: w3, MaxLoad: 5}})); err != nil {
		t.Fatalf("add worker: %v", err)
	}
	want := []string{w1, w2, w3}
	waitWorkers(t, nodes, want, "the worker set on every node")
	for _, n := range nodes {
		n.Terminate()
	}
	for _, n := range nodes[:2] {
		// A bound, so a migration stuck on the data dir fails the test
		// rather than hanging it.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := exec.CommandContext(ctx, n.Proc.Cmd.Path, "controlplane", "migrate-log", "-c", n.cfg).CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("migrate-log %s: %v\n%s", n.id, err, out)
		}
		if !strings.Contains(string(out), "to a WAL: ") || strings.Contains(string(out), " 0 entries") {
			t.Errorf("migrate-log %s said: %s", n.id, out)
		}
		for _, f := range []string{"wal", "raft.db.migrated"} {
			if !fileExists(filepath.Join(n.dir, f)) {
				t.Errorf("%s after migrating: no %s", n.id, f)
			}
		}
		// The config named bolt; the node would now refuse to start.
		cfg, err := os.ReadFile(n.cfg)
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, n.cfg, strings.Replace(string(cfg), bolt, "", 1))
	}
	if !fileExists(filepath.Join(nodes[2].dir, "raft.db")) {
		t.Fatal("the unmigrated node lost its bolt log")
	}
	for _, n := range nodes {
		n.Start(t)
	}
	waitLeader(t, nodes, 15*time.Second)
	waitWorkers(t, nodes, want, "the acknowledged workers after migrating")
	// The mixed cluster still commits.
	if _, err := waitLeader(t, nodes, 10*time.Second).admin().RemoveWorker(context.Background(), connect.NewRequest(&cartv1.RemoveWorkerRequest{Url: w1})); err != nil {
		t.Fatalf("remove worker after migrating: %v", err)
	}
	waitWorkers(t, nodes, []string{w2, w3}, "a change after migrating")
}
