package daemon_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
	"github.com/cartrouter/cart/internal/testkit"
)

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A control plane whose Raft address is reachable beyond loopback refuses
// to start without peer authentication, at --config-check and at start,
// unless the operator opts out explicitly.
func TestRefusesUnauthenticatedRemoteRaft(t *testing.T) {
	dir := t.TempDir()
	write := func(name, extra string) string {
		p := filepath.Join(dir, name)
		body := fmt.Sprintf("server: {min_open_files: 0}\ncontrolplane:\n  node_id: n1\n  api_addr: %s\n  raft_addr: %s\n  advertise_raft_addr: cp-1.internal:6702\n  data_dir: %s\n  bootstrap: true\n%s",
			freePort(t), freePort(t), filepath.Join(dir, name+".data"), extra)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	refused := write("open.yaml", "")
	for _, args := range [][]string{{"controlplane", "-c", refused, "--config-check"}, {"controlplane", "-c", refused}} {
		cmd := exec.Command(cartBin, args...)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || !strings.Contains(string(out), "Raft peers are not authenticated") {
			t.Errorf("cart %v: err %v, output:\n%s", args, err, out)
		}
	}
	for name, extra := range map[string]string{
		"token.yaml":  "auth: {token: cluster-secret}\n",
		"optout.yaml": "  allow_unauthenticated_raft: true\n",
	} {
		p := write(name, extra)
		if out, err := exec.Command(cartBin, "controlplane", "-c", p, "--config-check").CombinedOutput(); err != nil {
			t.Errorf("%s: --config-check failed: %v\n%s", name, err, out)
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
	dir := t.TempDir()
	api, raftAddr := freePort(t), freePort(t)
	cfg := filepath.Join(dir, "cp.yaml")
	body := fmt.Sprintf("server: {min_open_files: 0}\nlog: {level: warn}\nauth: {token: idle-test-token}\ncontrolplane:\n  node_id: n1\n  api_addr: %s\n  raft_addr: %s\n  data_dir: %s\n  bootstrap: true\n  raft_handshake_timeout_ms: 1500\n  raft_max_conns: %d\n",
		api, raftAddr, filepath.Join(dir, "data"), maxConns)
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuf{}
	cmd := exec.Command(cartBin, "controlplane", "-c", cfg)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("node log:\n%s", logs.String())
		}
	}()
	ac := cartv1connect.NewAdminServiceClient(client, "http://"+api, connect.WithGRPC(),
		connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set("Authorization", "Bearer idle-test-token")
				return next(ctx, req)
			}
		})))
	leader := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		r, err := ac.ClusterStatus(ctx, connect.NewRequest(&cartv1.ClusterStatusRequest{}))
		return err == nil && r.Msg.GetState() == "leader"
	}
	testkit.WaitFor(t, 15*time.Second, "the node to lead", leader)
	pid := cmd.Process.Pid
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
		c, err := net.DialTimeout("tcp", raftAddr, 5*time.Second)
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
	if !strings.Contains(logs.String(), "inbound connection cap reached") {
		t.Error("refusals at the cap not logged")
	}
}

// Three real nodes sharing a cluster token form a cluster through the
// ordinary join path (handshake on every Raft connection), and every node
// writes the same audited worker change with the actor who asked for it.
func TestTokenClusterAuditsOnEveryNode(t *testing.T) {
	const token = "three-node-cluster-token"
	base := t.TempDir()
	type node struct {
		id, api, raft, cfg string
		logs               *lockedBuf
		cmd                *exec.Cmd
	}
	var nodes []*node
	for i := 1; i <= 3; i++ {
		n := &node{id: fmt.Sprintf("n%d", i), api: freePort(t), raft: freePort(t), logs: &lockedBuf{}}
		var sb strings.Builder
		fmt.Fprintf(&sb, "server: {min_open_files: 0}\nlog: {level: info, format: text}\nauth: {token: %s}\n", token)
		fmt.Fprintf(&sb, "controlplane:\n  node_id: %s\n  api_addr: %s\n  raft_addr: %s\n  data_dir: %s\n", n.id, n.api, n.raft, filepath.Join(base, n.id))
		if i == 1 {
			sb.WriteString("  bootstrap: true\nworkers:\n  - url: http://127.0.0.1:9\n")
		} else {
			fmt.Fprintf(&sb, "  join: [http://%s]\n", nodes[0].api)
		}
		n.cfg = filepath.Join(base, n.id+".yaml")
		if err := os.WriteFile(n.cfg, []byte(sb.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			if n.cmd != nil {
				_ = n.cmd.Process.Signal(syscall.SIGKILL)
				_ = n.cmd.Wait()
			}
			if t.Failed() {
				t.Logf("--- %s log:\n%s", n.id, n.logs.String())
			}
		}
	})
	for _, n := range nodes {
		n.cmd = exec.Command(cartBin, "controlplane", "-c", n.cfg)
		n.cmd.Stdout, n.cmd.Stderr = n.logs, n.logs
		if err := n.cmd.Start(); err != nil {
			t.Fatal(err)
		}
	}
	bearer := connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("Authorization", "Bearer "+token)
			return next(ctx, req)
		}
	}))
	adminOf := func(n *node) cartv1connect.AdminServiceClient {
		return cartv1connect.NewAdminServiceClient(client, "http://"+n.api, connect.WithGRPC(), bearer)
	}
	testkit.WaitFor(t, 30*time.Second, "three voters and a leader", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		r, err := adminOf(nodes[0]).ClusterStatus(ctx, connect.NewRequest(&cartv1.ClusterStatusRequest{}))
		return err == nil && len(r.Msg.GetMembers()) == 3 && r.Msg.GetLeaderUrl() != ""
	})
	testkit.WaitFor(t, 30*time.Second, "a worker added through a node", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err := adminOf(nodes[2]).AddWorker(ctx, connect.NewRequest(&cartv1.AddWorkerRequest{Worker: &cartv1.Worker{Url: "http://127.0.0.1:10", MaxLoad: 3}}))
		return err == nil
	})
	for _, n := range nodes {
		testkit.WaitFor(t, 10*time.Second, n.id+"'s audit lines", func() bool {
			out := n.logs.String()
			return strings.Contains(out, `msg="audit: worker added"`) &&
				strings.Contains(out, `actor="cluster token from 127.0.0.1:`) &&
				strings.Contains(out, `worker=http://127.0.0.1:10 old=(none) new="http://127.0.0.1:10 max_load=3`) &&
				strings.Contains(out, `msg="audit: worker set replaced"`) &&
				strings.Contains(out, `msg="audit: raft membership changed"`)
		})
	}
}
