package raftnode

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/cartrouter/cart/internal/testkit"
)

// upgradeMember is one node of the upgrade test: a fixed address and data
// dir, so that it can be restarted under another handshake setting.
type upgradeMember struct {
	id, addr, dir string
	node          *Node
	rep           *replica
}

// The rolling upgrade from releases whose Raft handshake was keyed by the
// cluster token (v1), on real TCP and disk, one node at a time as the
// docs/security.md's steps say:
//
//  1. old nodes (v1 only) and upgraded nodes with the transition setting
//     (Raft token plus the cluster token accepted) form one cluster, led
//     by either;
//  2. once every node runs the transition setting, the nodes drop it one
//     at a time: nodes with and without it keep replicating;
//  3. at the end, a peer holding only the cluster token gets nothing in.
//
// Each step commits a write that must reach every node.
func TestRollingUpgradeToRaftToken(t *testing.T) {
	logBuf := &testkit.SyncBuffer{}
	log := slog.New(slog.NewTextHandler(logBuf, nil))
	fatals := &fatalRecorder{}
	base := t.TempDir()
	type setting struct{ raft, legacy string }
	var (
		old    = setting{legacy: clusterToken}
		moving = setting{raft: testToken, legacy: clusterToken}
		final  = setting{raft: testToken}
	)
	start := func(m *upgradeMember, s setting, bootstrap bool) {
		t.Helper()
		m.rep = newReplica()
		n, err := Start(Config{NodeID: m.id, BindAddr: m.addr, DataDir: m.dir, Bootstrap: bootstrap,
			RaftToken: s.raft, LegacyToken: s.legacy, Timeouts: &tcpTimeouts, Logger: log.With("node", m.id), Fatal: fatals.add}, m.rep.st, nil)
		if err != nil {
			t.Fatalf("start %s: %v", m.id, err)
		}
		m.node = n
	}
	members := make([]*upgradeMember, 3)
	for i := range members {
		id := fmt.Sprintf("n%d", i+1)
		members[i] = &upgradeMember{id: id, addr: testkit.FreeAddr(t), dir: filepath.Join(base, id)}
	}
	t.Cleanup(func() {
		for _, m := range members {
			_ = m.node.Shutdown()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	onLeader := func(what string, op func(n *Node) error) {
		t.Helper()
		testkit.WaitFor(t, 20*time.Second, what, func() bool {
			for _, m := range members {
				if m.node.IsLeader() && op(m.node) == nil {
					return true
				}
			}
			return false
		})
	}
	writes := 0
	replicated := func(step string) {
		t.Helper()
		writes++
		url := fmt.Sprintf("http://w%d:8000", writes)
		onLeader(step+": commit "+url, func(n *Node) error {
			_, err := n.Apply(ctx, upsertCmd(url, 1))
			return err
		})
		testkit.WaitFor(t, 20*time.Second, step+": "+url+" on every node", func() bool {
			for _, m := range members {
				if ws, _ := m.rep.st.Workers(); len(ws) != writes {
					return false
				}
			}
			return true
		})
	}
	restart := func(m *upgradeMember, s setting) {
		t.Helper()
		if err := m.node.Shutdown(); err != nil {
			t.Fatalf("stop %s: %v", m.id, err)
		}
		start(m, s, false)
	}

	// Step 1: n1 is still the old release; n2 and n3 come up upgraded,
	// with the transition setting, and join through it.
	n1, n2, n3 := members[0], members[1], members[2]
	start(n1, old, true)
	testkit.WaitFor(t, 10*time.Second, "the old node to lead", n1.node.IsLeader)
	start(n2, moving, false)
	start(n3, moving, false)
	for _, m := range members[1:] {
		onLeader("add "+m.id, func(n *Node) error { return n.AddVoter(ctx, m.id, m.addr) })
	}
	replicated("old and upgrading nodes")
	// An upgraded node leading must reach the old one: it tries the Raft
	// token's handshake, is refused, and falls back to the cluster token's.
	testkit.WaitFor(t, 20*time.Second, "an upgraded node to lead", func() bool {
		if n2.node.IsLeader() || n3.node.IsLeader() {
			return true
		}
		if n1.node.IsLeader() {
			_, _ = n1.node.TransferLeadership(ctx, "n2")
		}
		return false
	})
	replicated("an upgraded node leading an old one")
	// The upgraded nodes' peers in the old release showed up as such.
	if !strings.Contains(logBuf.String(), "peer authenticated with the cluster token") {
		t.Error("no warning about peers on the cluster-token handshake during the upgrade")
	}

	// n1 gets the new release with the transition setting too.
	restart(n1, moving)
	replicated("every node in the transition")

	// Step 2: the transition setting goes, one node at a time.
	restart(n2, final)
	replicated("n2 without the transition setting")
	restart(n3, final)
	replicated("n3 without the transition setting")
	restart(n1, final)
	replicated("every node on the Raft token alone")

	// Step 3: the cluster token opens nothing any more.
	target := n2
	term, last := target.node.Raft().CurrentTerm(), target.node.Raft().LastIndex()
	stream := authStream(t, "", streamOptions{log: log, auth: mustAuthWith(t, "probe", "", clusterToken)})
	trans := raft.NewNetworkTransportWithLogger(stream, 1, 2*time.Second, newHCLogAdapter(log, "rogue"))
	defer trans.Close()
	hdr := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("probe"), Addr: []byte(stream.Addr().String())}
	var resp raft.AppendEntriesResponse
	err := trans.AppendEntries(raft.ServerID(target.id), raft.ServerAddress(target.addr), &raft.AppendEntriesRequest{
		RPCHeader: hdr, Term: term + 100, PrevLogEntry: last, PrevLogTerm: term, LeaderCommitIndex: last,
	}, &resp)
	if err == nil || resp.Success {
		t.Errorf("append entries with the cluster token after the upgrade: success=%v err=%v", resp.Success, err)
	}
	if got := target.node.Raft().CurrentTerm(); got >= term+100 {
		t.Errorf("term jumped from %d to %d", term, got)
	}
	if errs := fatals.all(); len(errs) > 0 {
		t.Errorf("unexpected Fatal calls: %v", errs)
	}
}
