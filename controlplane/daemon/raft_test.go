package daemon_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/internal/testkit/proc"
)

// A control plane whose Raft address is reachable beyond loopback refuses
// to start without peer authentication, at --config-check and at start,
// unless the operator opts out explicitly. The cluster token is not peer
// authentication: every data plane holds it.
func TestRefusesUnauthenticatedRemoteRaft(t *testing.T) {
	const advertise = "  advertise_raft_addr: cp-1.internal:6702\n"
	run := func(o nodeOpts, args ...string) proc.Result {
		n := layoutNodes(t, 1, o)[0]
		return proc.Run(t, proc.Cmd{Path: n.Path, Args: append(n.Args, args...)})
	}
	for _, args := range [][]string{{"--config-check"}, nil} {
		for name, o := range map[string]nodeOpts{
			"no token":               {cp: advertise},
			"only the cluster token": {cp: advertise, token: "cluster-secret"},
		} {
			if r := run(o, args...); r.Code == 0 || !strings.Contains(r.Output, "Raft peers are not authenticated") {
				t.Errorf("%s: cart controlplane %v: exit %d, output:\n%s", name, args, r.Code, r.Output)
			}
		}
	}
	for name, o := range map[string]nodeOpts{
		"raft token": {cp: advertise, token: "cluster-secret", raftToken: "raft-secret"},
		"opt-out":    {cp: advertise + "  allow_unauthenticated_raft: true\n"},
	} {
		if r := run(o, "--config-check"); r.Code != 0 {
			t.Errorf("%s: --config-check failed: exit %d\n%s", name, r.Code, r.Output)
		}
	}
}

func procRSSAndFDs(t *testing.T, pid int) (rssKB int, fds int) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			rssKB, _ = strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		}
	}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Skipf("cannot list fds: %v", err)
	}
	return rssKB, len(ents)
}

// 1,000 idle connections to the Raft port of a real node: beyond
// raft_max_conns (default 256) they are closed at once, the rest at the
// handshake deadline, so the node's descriptors and memory stay bounded.
// CART_RAFT_IDLE_CONNS changes the count (for measurements).
func TestRaftListenerBoundsIdleConnections(t *testing.T) {
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("CART_RAFT_IDLE_CONNS")); err == nil && v > 0 {
		n = v
	}
	const maxConns = 256
	const token = "idle-test-token"
	nd := startNodes(t, 1, nodeOpts{token: token, raftToken: "idle-test-raft-token",
		cp: fmt.Sprintf("  raft_handshake_timeout_ms: 1500\n  raft_max_conns: %d\n", maxConns)})[0]
	leader := func() bool {
		st, err := nd.status()
		return err == nil && st.GetState() == "leader"
	}
	testkit.WaitFor(t, 15*time.Second, "the node to lead", leader)
	pid := nd.Pid()
	rss0, fd0 := procRSSAndFDs(t, pid)

	var closed atomic.Int64
	conns := make([]net.Conn, 0, n)
	var wg sync.WaitGroup
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
		wg.Wait()
	}()
	for range n {
		c, err := net.DialTimeout("tcp", nd.raft, 5*time.Second)
		if err != nil {
			t.Fatalf("dial %d: %v", len(conns), err)
		}
		conns = append(conns, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = io.Copy(io.Discard, c) // returns when the node closes it
			closed.Add(1)
		}()
	}
	testkit.WaitFor(t, 10*time.Second, "the connections beyond the cap to be closed", func() bool { return closed.Load() >= int64(n-maxConns) })
	rss1, fd1 := procRSSAndFDs(t, pid)
	testkit.WaitFor(t, 10*time.Second, "every idle connection to be closed at the handshake deadline", func() bool { return closed.Load() == int64(n) })
	testkit.WaitFor(t, 5*time.Second, "the node's descriptors to be released", func() bool { _, fd := procRSSAndFDs(t, pid); return fd <= fd0+4 })
	rss2, fd2 := procRSSAndFDs(t, pid)
	t.Logf("%d idle connections: before RSS %d kB, %d fds; with them open RSS %d kB, %d fds; after the handshake deadline RSS %d kB, %d fds",
		n, rss0, fd0, rss1, fd1, rss2, fd2)
	if n > maxConns && fd1 > fd0+maxConns+8 {
		t.Errorf("node held %d descriptors for %d idle connections (cap %d)", fd1-fd0, n, maxConns)
	}
	if grow := rss1 - rss0; grow > 64<<10 {
		t.Errorf("RSS grew by %d kB with %d idle connections", grow, n)
	}
	if !leader() {
		t.Error("node no longer leads after the connection flood")
	}
	if !nd.Log.Contains("inbound connection cap reached") {
		t.Error("refusals at the cap not logged")
	}
}

// Three real nodes sharing a Raft token form a cluster through the
// ordinary join path (handshake on every Raft connection), and every node
// writes the same audited worker change with the actor who asked for it.
func TestTokenClusterAuditsOnEveryNode(t *testing.T) {
	const token = "three-node-cluster-token"
	nodes := startNodes(t, 3, nodeOpts{log: "{level: info, format: text}", token: token, raftToken: "three-node-raft-token", workers: []string{"http://127.0.0.1:9"}})
	testkit.WaitFor(t, 30*time.Second, "a worker added through a node", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err := nodes[2].admin().AddWorker(ctx, connect.NewRequest(&cartv1.AddWorkerRequest{Worker: &cartv1.Worker{Url: "http://127.0.0.1:10", MaxLoad: 3}}))
		return err == nil
	})
	for _, n := range nodes {
		testkit.WaitFor(t, 30*time.Second, n.id+"'s audit lines", func() bool {
			out := n.Log.String()
			return strings.Contains(out, `msg="audit: worker added"`) &&
				strings.Contains(out, `actor="cluster token from 127.0.0.1:`) &&
				strings.Contains(out, `worker=http://127.0.0.1:10 old=(none) new="http://127.0.0.1:10 max_load=3`) &&
				strings.Contains(out, `msg="audit: worker set replaced"`) &&
				strings.Contains(out, `msg="audit: raft membership changed"`)
		})
	}
}
