package raftnode

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hashicorp/raft-wal/metadb"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
)

// tcpTimeouts leave real sockets, TLS handshakes and fsyncs some room on a
// loaded machine while keeping elections well under a second.
var tcpTimeouts = Timeouts{Heartbeat: 200 * time.Millisecond, Election: 200 * time.Millisecond, LeaderLease: 200 * time.Millisecond, Commit: 10 * time.Millisecond}

// A single node on TCP survives a restart from its data directory, on
// either log store: it restores its snapshot, replays the log after it, and
// leads again without bootstrapping. A restart with the default log store
// keeps the log the directory holds (an upgraded bolt node stays on bolt),
// and naming the other kind is refused.
func TestDiskRestart(t *testing.T) {
	for _, store := range []string{"", LogStoreBolt} {
		t.Run("log_store="+store, func(t *testing.T) { testDiskRestart(t, store) })
	}
}

func testDiskRestart(t *testing.T, store string) {
	dir := filepath.Join(t.TempDir(), "data")
	if ok, err := HasExistingState(dir); err != nil || ok {
		t.Fatalf("HasExistingState on a missing dir = %v, %v", ok, err)
	}
	fatals := &fatalRecorder{}
	cfg := Config{NodeID: "solo", BindAddr: "127.0.0.1:0", DataDir: dir, LogStore: store, Bootstrap: true, Timeouts: &tcpTimeouts, Logger: testLogger(t), Fatal: fatals.add}
	rep := newReplica()
	n, err := Start(cfg, rep.st, nil)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	defer n.Shutdown()
	testkit.WaitFor(t, 5*time.Second, "bootstrap leader", n.IsLeader)
	addr := n.Addr()
	if !strings.HasPrefix(addr, "127.0.0.1:") || strings.HasSuffix(addr, ":0") {
		t.Fatalf("advertised address %q: want the bound 127.0.0.1 port", addr)
	}
	apply := func(n *Node, cmd *cartv1.RaftCommand) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := n.Apply(ctx, cmd); err != nil {
			t.Fatalf("apply: %v", err)
		}
	}
	apply(n, upsertCmd("http://w1:8000", 4))
	apply(n, upsertCmd("http://w2:8000", 4))
	if err := n.Raft().Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	// Entries after the snapshot come back from the log.
	r := mrand.New(mrand.NewPCG(1, 1))
	apply(n, upsertCmd("http://w3:8000", 4))
	apply(n, placeCmd(placement("http://w3:8000", newPrompt(r, 5), 1), placement("http://w2:8000", newPrompt(r, 3), 2)))
	apply(n, removeCmd("http://w1:8000"))
	apply(n, memberCmd("solo", "http://127.0.0.1:9000"))
	before := rep.dump()

	// A second node on the same directory must fail, not corrupt it.
	if _, err := Start(Config{NodeID: "other", BindAddr: "127.0.0.1:0", DataDir: dir, Logger: testLogger(t)}, newReplica().st, nil); err == nil {
		t.Fatal("a second node started on a data dir in use")
	}

	if err := n.Shutdown(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("data dir: %v, mode %v; want 0700", err, fi.Mode().Perm())
	}
	// A new data dir gets a WAL unless bolt was asked for, never both.
	walMeta, boltDB := filepath.Join(dir, walDir, metadb.FileName), filepath.Join(dir, raftDBFile)
	want, other, otherKind := walMeta, boltDB, LogStoreBolt
	if store == LogStoreBolt {
		want, other, otherKind = boltDB, walMeta, LogStoreWAL
	}
	checkFiles := func() {
		t.Helper()
		if _, err := os.Stat(want); err != nil {
			t.Errorf("log store %q: %v", store, err)
		}
		if _, err := os.Stat(other); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("log store %q: %s exists (%v), want it absent", store, other, err)
		}
	}
	checkFiles()
	if ok, err := HasExistingState(dir); err != nil || !ok {
		t.Fatalf("HasExistingState after shutdown = %v, %v", ok, err)
	}

	rep2 := newReplica()
	lead := &leadership{}
	cfg.Bootstrap = false
	cfg.BindAddr = addr // the configuration stored in the log names this address
	cfg.LogStore = LogStoreAuto
	n2, err := Start(cfg, rep2.st, lead.add)
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	defer n2.Shutdown()
	testkit.WaitFor(t, 5*time.Second, "leadership after restart", n2.IsLeader)
	if got := rep2.dump(); !got.equal(before) {
		t.Fatalf("state after restart differs:\n got  %s\n want %s", got, before)
	}
	if n2.restores() != 1 {
		t.Errorf("restores = %d, want 1 (the snapshot)", n2.restores())
	}
	if ev := lead.all(); !slices.Equal(ev, []bool{true}) {
		t.Errorf("onLeadership calls = %v, want [true]", ev)
	}
	apply(n2, upsertCmd("http://w4:8000", 4))
	if ws, _ := rep2.st.Workers(); len(ws) != 3 {
		t.Errorf("workers after restart and one more upsert: %v", ws)
	}
	if err := n2.Shutdown(); err != nil {
		t.Fatalf("shutdown after restart: %v", err)
	}
	checkFiles()
	cfg.LogStore = otherKind
	if n3, err := Start(cfg, newReplica().st, nil); err == nil {
		_ = n3.Shutdown()
		t.Errorf("a node asking for %q started on a data dir holding the other log", otherKind)
	} else if !strings.Contains(err.Error(), "empty its data dir and join it again") {
		t.Errorf("start asking for the other log store: %v, want the way to move named", err)
	} else if otherKind == LogStoreWAL && !strings.Contains(err.Error(), "cart controlplane migrate-log") {
		t.Errorf("start asking for a WAL on a bolt log: %v, want the migration named", err)
	}
	checkFiles()
	if errs := fatals.all(); len(errs) > 0 {
		t.Errorf("unexpected Fatal calls: %v", errs)
	}
}

// tcpMember is one node of a test cluster on the TCP transport, with the
// replica its state machine applies to.
type tcpMember struct {
	id   string
	rep  *replica
	node *Node
}

// startTCPMember starts a node on a loopback port with in-memory stores;
// secure adds the credentials its cluster authenticates peers with.
func startTCPMember(t *testing.T, id string, bootstrap bool, log *slog.Logger, fatals *fatalRecorder, secure func(*Config)) *tcpMember {
	t.Helper()
	mem := raft.NewInmemStore()
	m := &tcpMember{id: id, rep: newReplica()}
	cfg := Config{
		NodeID:    id,
		BindAddr:  "127.0.0.1:0",
		Bootstrap: bootstrap,
		Stores:    &Stores{Log: mem, Stable: mem, Snap: raft.NewInmemSnapshotStore()},
		Timeouts:  &tcpTimeouts,
		Logger:    log,
		Fatal:     fatals.add,
	}
	secure(&cfg)
	n, err := Start(cfg, m.rep.st, nil)
	if err != nil {
		t.Fatalf("start %s: %v", id, err)
	}
	m.node = n
	return m
}

// Three nodes over mutually authenticated TLS elect a leader and
// replicate; a peer without a certificate from the cluster's CA can neither
// talk to the members nor receive the log when added.
func TestTLSCluster(t *testing.T) {
	ca := testkit.NewCA(t)
	log := testLogger(t)
	fatals := &fatalRecorder{}
	start := func(id string, ca *testkit.CA, bootstrap bool) *tcpMember {
		t.Helper()
		cert := ca.Issue(t, id)
		m := startTCPMember(t, id, bootstrap, log, fatals, func(c *Config) {
			c.ServerTLS = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: ca.Pool, MinVersion: tls.VersionTLS13}
			c.ClientTLS = &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: ca.Pool, MinVersion: tls.VersionTLS13}
		})
		t.Cleanup(func() {
			if err := m.node.Shutdown(); err != nil {
				t.Errorf("shutdown %s: %v", id, err)
			}
		})
		return m
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	n1 := start("n1", ca, true)
	testkit.WaitFor(t, 5*time.Second, "bootstrap leader", n1.node.IsLeader)
	members := []*tcpMember{n1, start("n2", ca, false), start("n3", ca, false)}
	// onLeader runs op on the current leader, again if leadership moves.
	onLeader := func(what string, op func(ld *tcpMember) error) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			var ld *tcpMember
			testkit.WaitFor(t, 5*time.Second, "a leader", func() bool {
				for _, m := range members {
					if m.node.IsLeader() {
						ld = m
						return true
					}
				}
				return false
			})
			err := op(ld)
			if err == nil {
				return
			}
			if !errors.Is(err, ErrNotLeader) || time.Now().After(deadline) {
				t.Fatalf("%s on %s: %v", what, ld.id, err)
			}
		}
	}
	// A loaded machine can cost the leader its lease mid-change: retry on
	// whoever leads (AddVoter is idempotent).
	for _, m := range members[1:] {
		onLeader("add voter "+m.id, func(ld *tcpMember) error { return ld.node.AddVoter(ctx, m.id, m.node.Addr()) })
	}
	onLeader("apply over TLS", func(ld *tcpMember) error {
		_, err := ld.node.Apply(ctx, upsertCmd("http://w1:8000", 1))
		return err
	})
	testkit.WaitFor(t, 5*time.Second, "replication to every member", func() bool {
		for _, m := range members {
			if ws, _ := m.rep.st.Workers(); len(ws) != 1 {
				return false
			}
		}
		return true
	})

	// A client without a certificate, or with one from another CA, is
	// refused at the handshake: its RPCs never reach raft, so a vote
	// request with a huge term does not disturb anyone.
	target := members[1]
	term := target.node.Raft().CurrentTerm()
	other := testkit.NewCA(t)
	for name, clientTLS := range map[string]*tls.Config{
		"no client certificate": {RootCAs: ca.Pool, MinVersion: tls.VersionTLS13},
		"foreign certificate":   {Certificates: []tls.Certificate{other.Issue(t, "rogue")}, RootCAs: ca.Pool, MinVersion: tls.VersionTLS13},
	} {
		stream, err := newStreamLayer("127.0.0.1:0", "", nil, clientTLS, streamOptions{})
		if err != nil {
			t.Fatal(err)
		}
		trans := raft.NewNetworkTransportWithLogger(stream, 1, 2*time.Second, newHCLogAdapter(log, "rogue"))
		req := &raft.RequestVoteRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("rogue"), Addr: []byte(stream.Addr().String())}, Term: term + 100, LastLogIndex: 1 << 40, LastLogTerm: term + 100}
		err = trans.RequestVote(raft.ServerID(target.id), raft.ServerAddress(target.node.Addr()), req, &raft.RequestVoteResponse{})
		_ = trans.Close()
		if err == nil {
			t.Errorf("%s: the vote request reached %s's raft; the handshake should have refused it", name, target.id)
		}
	}
	// (An ordinary election may still bump the term on a loaded machine;
	// only the rogue's would jump it by a hundred.)
	if got := target.node.Raft().CurrentTerm(); got >= term+100 {
		t.Errorf("%s's term jumped from %d to %d: a rogue vote request got through", target.id, term, got)
	}

	// A node whose certificates come from another CA cannot join even when
	// a leader adds it: the leader refuses its server certificate, and it
	// cannot dial anyone, so it never receives an entry.
	rogue := start("rogue", other, false)
	// Evidence that the leader did try to replicate to the rogue: raft
	// reports each failed heartbeat to it. Watch every member, since the
	// leader may change while the rogue is added.
	failed := make(chan raft.Observation, 64)
	for _, m := range members {
		ob := raft.NewObserver(failed, false, func(o *raft.Observation) bool {
			f, ok := o.Data.(raft.FailedHeartbeatObservation)
			return ok && f.PeerID == "rogue"
		})
		m.node.Raft().RegisterObserver(ob)
		t.Cleanup(func() { m.node.Raft().DeregisterObserver(ob) })
	}
	onLeader("add rogue voter", func(ld *tcpMember) error { return ld.node.AddVoter(ctx, "rogue", rogue.node.Addr()) })
	for i := range 2 {
		select {
		case <-failed:
		case <-time.After(10 * time.Second):
			t.Fatalf("no failed heartbeat to the rogue after %d: the leader never tried to reach it", i)
		}
	}
	if last := rogue.node.Raft().LastIndex(); last != 0 {
		t.Errorf("rogue node received log entries up to %d", last)
	}
	if ws, _ := rogue.rep.st.Workers(); len(ws) != 0 {
		t.Errorf("rogue node learnt the worker set: %v", ws)
	}
	onLeader("remove rogue", func(ld *tcpMember) error { return ld.node.RemoveServer(ctx, "rogue") })
	if errs := fatals.all(); len(errs) > 0 {
		t.Errorf("unexpected Fatal calls: %v", errs)
	}
}

// The stream layer refuses advertise addresses peers could not dial.
func TestStreamLayerRejectsWildcardAdvertise(t *testing.T) {
	for _, adv := range []string{"0.0.0.0:7000", "[::]:7000", "host-without-port", "h:0"} {
		if s, err := newStreamLayer("127.0.0.1:0", adv, nil, nil, streamOptions{}); err == nil {
			_ = s.Close()
			t.Errorf("advertise %q accepted", adv)
		}
	}
	s, err := newStreamLayer("127.0.0.1:0", "raft1.example:7000", nil, nil, streamOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// A host name stays a host name: TLS peers verify it against DNS SANs.
	if got := s.Addr().String(); got != "raft1.example:7000" {
		t.Errorf("advertised %q", got)
	}
	// Close also drops open connections (raft's transport would not).
	conn, err := net.Dial("tcp", s.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	accepted, err := s.Accept()
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	if _, err := accepted.Read(make([]byte, 1)); err == nil {
		t.Error("accepted connection still open after Close")
	}
}
