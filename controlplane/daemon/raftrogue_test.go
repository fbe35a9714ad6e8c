package daemon_test

import (
	"bytes"
	"context"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/cartrouter/cart/controlplane/state"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
)

// handshakeWire is one generation of the Raft peer handshake as an
// outsider implements it from its description (controlplane/raftnode
// doc.go, "The Raft port"): the magic, and the HKDF info and MAC labels of its key.
type handshakeWire struct {
	magic, info, listener, dialer string
}

var (
	// wireV1 is the handshake of releases before auth.raft_token: keyed by
	// the cluster token, which every data plane holds.
	wireV1 = handshakeWire{"CARTRFT1", "cart raft peer authentication v1", "cart raft handshake v1: listener proof", "cart raft handshake v1: dialer proof"}
	wireV2 = handshakeWire{"CARTRFT2", "cart raft peer authentication v2 (raft token)", "cart raft handshake v2: listener proof", "cart raft handshake v2: dialer proof"}
)

// rogueStream is a raft.StreamLayer that opens every connection with the
// handshake of wire keyed by secret, claiming to be node id.
type rogueStream struct {
	ln     net.Listener
	wire   handshakeWire
	secret string
	id     string
}

func (r *rogueStream) Accept() (net.Conn, error) { return r.ln.Accept() }
func (r *rogueStream) Close() error              { return r.ln.Close() }
func (r *rogueStream) Addr() net.Addr            { return r.ln.Addr() }

func (r *rogueStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", string(addr), timeout)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := r.handshake(c); err != nil {
		_ = c.Close()
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

func (r *rogueStream) handshake(c net.Conn) error {
	key, err := hkdf.Key(sha256.New, []byte(r.secret), nil, r.wire.info, 32)
	if err != nil {
		return err
	}
	mac := func(label string, nc, ns []byte, idc, ids string) []byte {
		h := hmac.New(sha256.New, key)
		for _, b := range [][]byte{[]byte(label), nc, ns, {byte(len(idc))}, []byte(idc), {byte(len(ids))}, []byte(ids)} {
			h.Write(b)
		}
		return h.Sum(nil)
	}
	nc := make([]byte, 32)
	_, _ = rand.Read(nc)
	hello := append(append(append([]byte(r.wire.magic), nc...), byte(len(r.id))), r.id...)
	if _, err := c.Write(hello); err != nil {
		return err
	}
	head := make([]byte, 8+32+1)
	if _, err := io.ReadFull(c, head); err != nil {
		return fmt.Errorf("listener hello: %w", err)
	}
	if string(head[:8]) != r.wire.magic {
		return fmt.Errorf("listener answered %q", head[:8])
	}
	ns := head[8:40]
	rest := make([]byte, int(head[40])+32)
	if _, err := io.ReadFull(c, rest); err != nil {
		return fmt.Errorf("listener hello: %w", err)
	}
	ids, proof := string(rest[:len(rest)-32]), rest[len(rest)-32:]
	if !hmac.Equal(proof, mac(r.wire.listener, nc, ns, r.id, ids)) {
		return errors.New("listener proof does not match")
	}
	if _, err := c.Write(mac(r.wire.dialer, nc, ns, r.id, ids)); err != nil {
		return err
	}
	ack := make([]byte, 1)
	if _, err := io.ReadFull(c, ack); err != nil || ack[0] != 1 {
		return fmt.Errorf("no ack: %v", err)
	}
	return nil
}

// rogue is a Raft transport speaking wire with secret.
func rogue(t *testing.T, wire handshakeWire, secret string) *raft.NetworkTransport {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	trans := raft.NewNetworkTransportWithLogger(&rogueStream{ln: ln, wire: wire, secret: secret, id: "rogue"}, 1, 5*time.Second,
		hclog.New(&hclog.LoggerOptions{Output: io.Discard}))
	t.Cleanup(func() { _ = trans.Close() })
	return trans
}

// forgeWorkers sends n a vote request and an AppendEntries, far ahead of
// its term, whose one entry replaces the worker set with the attacker's.
func forgeWorkers(t *testing.T, trans *raft.NetworkTransport, n *node) (voted, appended bool, err error) {
	t.Helper()
	st, serr := n.status()
	if serr != nil {
		t.Fatal(serr)
	}
	evil, eerr := state.Encode(&cartv1.RaftCommand{Body: &cartv1.RaftCommand_SetWorkers{SetWorkers: &cartv1.SetWorkersCommand{
		Workers: []*cartv1.WorkerSpec{{Url: "http://attacker.example:8000", MaxLoad: 1000}},
	}}})
	if eerr != nil {
		t.Fatal(eerr)
	}
	term, last := st.GetTerm(), st.GetLastLogIndex()
	hdr := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("rogue"), Addr: []byte(trans.LocalAddr())}
	var vote raft.RequestVoteResponse
	verr := trans.RequestVote(raft.ServerID(n.id), raft.ServerAddress(n.raft),
		&raft.RequestVoteRequest{RPCHeader: hdr, Term: term + 100, LastLogIndex: last + 1000, LastLogTerm: term + 100}, &vote)
	var app raft.AppendEntriesResponse
	aerr := trans.AppendEntries(raft.ServerID(n.id), raft.ServerAddress(n.raft), &raft.AppendEntriesRequest{
		RPCHeader: hdr, Term: term + 200, PrevLogEntry: last, PrevLogTerm: term,
		Entries:           []*raft.Log{{Index: last + 1, Term: term + 200, Type: raft.LogCommand, Data: evil}},
		LeaderCommitIndex: last + 1,
	}, &app)
	return verr == nil && vote.Granted, aerr == nil && app.Success, errors.Join(verr, aerr)
}

// workersOf lists a node's worker URLs.
func workersOf(t *testing.T, n *node) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	r, err := n.admin().ListWorkers(ctx, connect.NewRequest(&cartv1.ListWorkersRequest{}))
	if err != nil {
		t.Fatalf("%s: list workers: %v", n.id, err)
	}
	var out []string
	for _, w := range r.Msg.GetWorkers() {
		out = append(out, w.GetUrl())
	}
	return out
}

// Attack #2 of issue 33, on three real `cart controlplane` processes: a
// peer that holds the cluster token (as every data plane does) forges Raft
// RPCs — the handshake keyed by the cluster token as releases before the
// Raft token had it, and the cluster token in the Raft token's place. No
// node answers either: no vote, no entry, no term change, the worker set
// stays. The same outsider code holding the Raft token does complete the
// handshake, so the refusals are the nodes' doing, not a broken attacker.
func TestClusterTokenOpensNothingOnTheRaftPort(t *testing.T) {
	const cluster, raftToken = "cluster-token-of-every-data-plane", "raft-token-of-the-control-plane"
	nodes := startNodes(t, 3, nodeOpts{log: "{level: info, format: text}", token: cluster, raftToken: raftToken,
		workers: []string{"http://127.0.0.1:9"}})
	for _, n := range nodes {
		testkit.WaitFor(t, 15*time.Second, n.id+" to hold the seeded worker", func() bool {
			ws := workersOf(t, n)
			return len(ws) == 1 && ws[0] == "http://127.0.0.1:9"
		})
	}
	terms := map[string]uint64{}
	for _, n := range nodes {
		st, err := n.status()
		if err != nil {
			t.Fatal(err)
		}
		terms[n.id] = st.GetTerm()
	}
	for name, trans := range map[string]*raft.NetworkTransport{
		"v1 handshake, cluster token":              rogue(t, wireV1, cluster),
		"v2 handshake, cluster token in its place": rogue(t, wireV2, cluster),
	} {
		for _, n := range nodes {
			voted, appended, err := forgeWorkers(t, trans, n)
			if voted || appended || err == nil {
				t.Errorf("%s → %s: vote granted %v, entries appended %v, error %v; want the connection refused", name, n.id, voted, appended, err)
			}
		}
	}
	for _, n := range nodes {
		if ws := workersOf(t, n); len(ws) != 1 || ws[0] != "http://127.0.0.1:9" {
			t.Errorf("%s's worker set is now %v", n.id, ws)
		}
		st, err := n.status()
		if err != nil {
			t.Fatal(err)
		}
		if st.GetTerm() >= terms[n.id]+100 {
			t.Errorf("%s's term jumped from %d to %d", n.id, terms[n.id], st.GetTerm())
		}
		testkit.WaitFor(t, 5*time.Second, n.id+"'s audit line for the refused rogue", func() bool {
			return n.Log.Contains("inbound peer failed authentication") && n.Log.Contains("claimed_id=rogue")
		})
	}
	// The control: the same code with the Raft token gets through the
	// handshake.
	good := &rogueStream{wire: wireV2, secret: raftToken, id: "control"}
	c, err := good.Dial(raft.ServerAddress(nodes[0].raft), 5*time.Second)
	if err != nil {
		t.Fatalf("the test's handshake with the Raft token failed: %v", err)
	}
	_ = c.Close()
	if out := nodes[0].Log.String(); strings.Contains(out, "panic") || bytes.Contains([]byte(out), []byte("fatal")) {
		t.Errorf("node log shows a crash:\n%s", out)
	}
}

// The rolling upgrade's last step on real processes. Three nodes run with
// auth.raft_accept_cluster_token (where every node is after the first
// rolling restart of the upgrade): a peer still on the cluster token's
// handshake — an old node's dialer — is let in, and the nodes idle past
// several index maintenance passes. Then each node in turn restarts
// without the setting: after each restart a worker change reaches every
// node, nodes with and without the setting talking to each other. At the
// end the cluster token's handshake is refused everywhere.
func TestRaftTokenTransitionThenStrict(t *testing.T) {
	const cluster, raftToken = "cluster-token-of-the-old-release", "new-raft-token"
	nodes := startNodes(t, 3, nodeOpts{token: cluster, raftToken: raftToken, raftTransition: true,
		extra: "cache: {eviction_interval_secs: 0.2}\n"})
	for _, n := range nodes {
		n.WaitLog(t, 10*time.Second, "also with the cluster token (auth.raft_accept_cluster_token")
	}
	old := &rogueStream{wire: wireV1, secret: cluster, id: "old-node"}
	for _, n := range nodes {
		c, err := old.Dial(raft.ServerAddress(n.raft), 5*time.Second)
		if err != nil {
			t.Fatalf("%s refused the cluster token's handshake during the transition: %v", n.id, err)
		}
		_ = c.Close()
	}
	time.Sleep(time.Second) // five maintenance passes
	added := 0
	replicate := func(step string) {
		t.Helper()
		added++
		url := fmt.Sprintf("http://127.0.0.1:%d", 10+added)
		testkit.WaitFor(t, 20*time.Second, step+": add "+url, func() bool {
			for _, n := range nodes {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				_, err := n.admin().AddWorker(ctx, connect.NewRequest(&cartv1.AddWorkerRequest{Worker: &cartv1.Worker{Url: url, MaxLoad: 1}}))
				cancel()
				if err == nil {
					return true
				}
			}
			return false
		})
		for _, n := range nodes {
			testkit.WaitFor(t, 20*time.Second, step+": "+url+" on "+n.id, func() bool { return len(workersOf(t, n)) == added })
		}
	}
	replicate("transition")
	for _, n := range nodes {
		if !n.Running() {
			t.Fatalf("%s exited during the transition", n.id)
		}
		n.Terminate()
		b, err := os.ReadFile(n.cfg)
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, n.cfg, strings.Replace(string(b), ", raft_accept_cluster_token: true", "", 1))
		n.Start(t)
		n.WaitFor(t, 15*time.Second, "the restarted node to know a leader", func() (bool, string) {
			st, err := n.status()
			return err == nil && st.GetLeaderUrl() != "", fmt.Sprint(st, err)
		})
		replicate(n.id + " restarted without the transition setting")
	}
	for _, n := range nodes {
		if c, err := old.Dial(raft.ServerAddress(n.raft), 5*time.Second); err == nil {
			_ = c.Close()
			t.Errorf("%s still accepts the cluster token's handshake after the transition", n.id)
		}
	}
}
