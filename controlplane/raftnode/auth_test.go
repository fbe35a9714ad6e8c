package raftnode

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/cartrouter/cart/controlplane/state"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
)

const (
	testToken    = "raft-token-for-tests"
	clusterToken = "cluster-token-every-data-plane-holds"
)

// pipeHandshake runs both sides of the handshake over an in-memory pipe,
// the client proving its first (preferred) key.
func pipeHandshake(t *testing.T, client, server *peerAuth) (cid, sid string, cerr, serr error) {
	cid, sid, _, cerr, serr = pipeHandshakeWith(t, client, client.keys[0], server)
	return cid, sid, cerr, serr
}

// pipeHandshakeWith runs the handshake with the client proving key k, and
// also returns the generation the server accepted.
func pipeHandshakeWith(t *testing.T, client *peerAuth, k peerKey, server *peerAuth) (cid, sid string, gen *generation, cerr, serr error) {
	t.Helper()
	c, s := net.Pipe()
	defer c.Close()
	defer s.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	_ = s.SetDeadline(time.Now().Add(5 * time.Second))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		cid, gen, serr = server.serverHandshake(s)
		if serr != nil {
			_ = s.Close()
		}
	}()
	sid, cerr = client.clientHandshake(c, k)
	if cerr != nil {
		_ = c.Close()
	}
	wg.Wait()
	return cid, sid, gen, cerr, serr
}

// mustAuth is a node holding the Raft token token.
func mustAuth(t *testing.T, token, id string) *peerAuth {
	t.Helper()
	return mustAuthWith(t, id, token, "")
}

// mustAuthWith is a node holding a Raft token and a legacy (cluster) token;
// either may be empty.
func mustAuthWith(t testing.TB, id, raftToken, legacy string) *peerAuth {
	t.Helper()
	a, err := newPeerAuth(id, raftToken, legacy)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestHandshake(t *testing.T) {
	cid, sid, cerr, serr := pipeHandshake(t, mustAuth(t, testToken, "n2"), mustAuth(t, testToken, "n1"))
	if cerr != nil || serr != nil {
		t.Fatalf("same token: client %v, server %v", cerr, serr)
	}
	if cid != "n2" || sid != "n1" {
		t.Errorf("ids: server saw %q, client saw %q", cid, sid)
	}
	// A wrong token fails on both sides, and the listener never accepts.
	_, _, cerr, serr = pipeHandshake(t, mustAuth(t, "wrong", "rogue"), mustAuth(t, testToken, "n1"))
	if !errors.Is(cerr, errHandshake) || serr == nil {
		t.Errorf("wrong client token: client %v, server %v", cerr, serr)
	}
	_, _, cerr, serr = pipeHandshake(t, mustAuth(t, testToken, "n2"), mustAuth(t, "wrong", "rogue"))
	if !errors.Is(cerr, errHandshake) || serr == nil {
		t.Errorf("wrong listener token: client %v, server %v", cerr, serr)
	}
	if _, err := newPeerAuth("n1", "", ""); err == nil {
		t.Error("empty token accepted")
	}
	if _, err := newPeerAuth(strings.Repeat("x", 256), testToken, ""); err == nil {
		t.Error("256-byte node id accepted")
	}
	if _, err := newPeerAuth("n1", testToken, testToken); err == nil {
		t.Error("a Raft token equal to the cluster token accepted")
	}
}

// The two handshake generations: v2 proves the Raft token, v1 (releases
// before it) the cluster token. A node without the legacy token refuses v1
// whatever the token, with a message naming the upgrade; a node in the
// upgrade accepts both, and its v1 peers see a v1 answer; a v1-only node
// (the old release) refuses v2.
func TestHandshakeGenerations(t *testing.T) {
	strict := mustAuthWith(t, "strict", testToken, "")
	moving := mustAuthWith(t, "moving", testToken, clusterToken)
	old := mustAuthWith(t, "old", "", clusterToken)
	if len(moving.keys) != 2 || moving.keys[0].gen != genV2 || moving.keys[1].gen != genV1 {
		t.Fatalf("a node in the upgrade holds %v; want v2 then v1", moving.keys)
	}
	for _, tc := range []struct {
		name           string
		client         *peerAuth
		key            peerKey
		server         *peerAuth
		ok             bool
		want           *generation
		serverSays     string
		clientFailsToo bool
	}{
		{"v2 to strict", moving, moving.keys[0], strict, true, genV2, "", false},
		{"v1 with the cluster token to strict", old, old.keys[0], strict, false, nil, "does not accept", true},
		{"v1 to a node in the upgrade", old, old.keys[0], moving, true, genV1, "", false},
		{"v2 to a node in the upgrade", strict, strict.keys[0], moving, true, genV2, "", false},
		{"v2 to an old node", moving, moving.keys[0], old, false, nil, "has none", true},
		{"v1 from a node in the upgrade to an old node", moving, moving.keys[1], old, true, genV1, "", false},
	} {
		cid, _, gen, cerr, serr := pipeHandshakeWith(t, tc.client, tc.key, tc.server)
		if tc.ok {
			if cerr != nil || serr != nil || gen != tc.want || cid != tc.client.nodeID {
				t.Errorf("%s: client %v, server %v, generation %v, id %q", tc.name, cerr, serr, gen, cid)
			}
			continue
		}
		if !errors.Is(serr, errHandshake) || !strings.Contains(serr.Error(), tc.serverSays) {
			t.Errorf("%s: server %v; want a handshake failure saying %q", tc.name, serr, tc.serverSays)
		}
		if tc.clientFailsToo && cerr == nil {
			t.Errorf("%s: the client completed a handshake the server refused", tc.name)
		}
	}
}

// scripted is a connection whose reads replay a recording and whose
// writes are discarded.
type scripted struct {
	io.Reader
	out bytes.Buffer
}

func (s *scripted) Write(p []byte) (int, error) { return s.out.Write(p) }

// recorder keeps what a dialer wrote.
type recorder struct {
	net.Conn
	mu  sync.Mutex
	buf bytes.Buffer
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	r.buf.Write(p)
	r.mu.Unlock()
	return r.Conn.Write(p)
}

// A recorded successful handshake, replayed byte for byte, fails: the
// listener's nonce is fresh, so the recorded proof is for another one.
func TestHandshakeReplayFails(t *testing.T) {
	server := mustAuth(t, testToken, "n1")
	c, s := net.Pipe()
	defer c.Close()
	defer s.Close()
	rec := &recorder{Conn: c}
	errc := make(chan error, 1)
	go func() { _, _, err := server.serverHandshake(s); errc <- err }()
	client := mustAuth(t, testToken, "n2")
	if _, err := client.clientHandshake(rec, client.keys[0]); err != nil {
		t.Fatalf("genuine handshake: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("genuine handshake, server side: %v", err)
	}
	rec.mu.Lock()
	recording := bytes.Clone(rec.buf.Bytes())
	rec.mu.Unlock()
	_, _, err := server.serverHandshake(&scripted{Reader: bytes.NewReader(recording)})
	if !errors.Is(err, errHandshake) {
		t.Fatalf("replayed handshake: %v; want a handshake failure", err)
	}
}

func authStream(t *testing.T, token string, opts streamOptions) *streamLayer {
	t.Helper()
	if token != "" {
		opts.auth = mustAuth(t, token, "probe")
	}
	s, err := newStreamLayer("127.0.0.1:0", "", nil, nil, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// Three nodes sharing the Raft token form a cluster and replicate. A rogue
// that knows only the Raft address — speaking raft's own wire protocol, or
// the handshake with a wrong token — is refused before its first RPC: no
// vote, no term change, no forged entry appended. So is one that holds the
// cluster token (every data plane does), with the handshake keyed by it as
// releases before the Raft token did, or with the cluster token in the
// Raft token's place.
func TestTokenClusterRefusesRogues(t *testing.T) {
	logBuf := &testkit.SyncBuffer{}
	log := slog.New(slog.NewTextHandler(logBuf, nil))
	fatals := &fatalRecorder{}
	start := func(id string, bootstrap bool) *tcpMember {
		t.Helper()
		m := startTCPMember(t, id, bootstrap, log, fatals, func(c *Config) { c.RaftToken = testToken })
		t.Cleanup(func() { _ = m.node.Shutdown() })
		return m
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n1 := start("n1", true)
	testkit.WaitFor(t, 5*time.Second, "bootstrap leader", n1.node.IsLeader)
	members := []*tcpMember{n1, start("n2", false), start("n3", false)}
	// A loaded machine can cost the leader its lease mid-change: retry on
	// whoever leads (AddVoter is idempotent).
	for _, m := range members[1:] {
		testkit.WaitFor(t, 15*time.Second, "add voter "+m.id, func() bool {
			for _, ld := range members {
				if ld.node.IsLeader() && ld.node.AddVoter(ctx, m.id, m.node.Addr()) == nil {
					return true
				}
			}
			return false
		})
	}
	var applied bool
	testkit.WaitFor(t, 10*time.Second, "a write committed by the authenticated cluster", func() bool {
		for _, m := range members {
			if m.node.IsLeader() && !applied {
				cmd := upsertCmd("http://w1:8000", 1)
				cmd.Actor = "admin token from 192.0.2.7:4000"
				_, err := m.node.Apply(ctx, cmd)
				applied = err == nil
			}
		}
		if !applied {
			return false
		}
		for _, m := range members {
			if ws, _ := m.rep.st.Workers(); len(ws) != 1 {
				return false
			}
		}
		return true
	})

	// Every node's audit log has the worker change with its actor, and the
	// membership changes.
	testkit.WaitFor(t, 5*time.Second, "audit lines on every node", func() bool {
		out := logBuf.String()
		for _, m := range members {
			if !strings.Contains(out, `msg="audit: worker added" node=`+m.id+` audit=true`) ||
				!strings.Contains(out, `actor="admin token from 192.0.2.7:4000"`) ||
				!strings.Contains(out, `msg="audit: raft membership changed" node=`+m.id+` audit=true`) ||
				!strings.Contains(out, `msg="audit: raft leader changed" node=`+m.id+` audit=true`) {
				return false
			}
		}
		return true
	})

	target := members[1]
	term := target.node.Raft().CurrentTerm()
	last := target.node.Raft().LastIndex()
	evil, err := state.Encode(&cartv1.RaftCommand{Body: &cartv1.RaftCommand_SetWorkers{SetWorkers: &cartv1.SetWorkersCommand{
		Workers: []*cartv1.WorkerSpec{{Url: "http://attacker.example:8000", MaxLoad: 1000}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	for name, auth := range map[string]*peerAuth{
		"plain raft, no handshake":                nil,
		"handshake with a wrong token":            mustAuthWith(t, "probe", "not-the-raft-token", ""),
		"v1 handshake with the cluster token":     mustAuthWith(t, "probe", "", clusterToken),
		"cluster token in the Raft token's place": mustAuthWith(t, "probe", clusterToken, ""),
	} {
		stream := authStream(t, "", streamOptions{log: log, auth: auth})
		trans := raft.NewNetworkTransportWithLogger(stream, 1, 2*time.Second, newHCLogAdapter(log, "rogue"))
		hdr := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("rogue"), Addr: []byte(stream.Addr().String())}
		vote := &raft.RequestVoteRequest{RPCHeader: hdr, Term: term + 100, LastLogIndex: last + 1000, LastLogTerm: term + 100}
		var voteResp raft.RequestVoteResponse
		verr := trans.RequestVote(raft.ServerID(target.id), raft.ServerAddress(target.node.Addr()), vote, &voteResp)
		app := &raft.AppendEntriesRequest{
			RPCHeader: hdr, Term: term + 200, PrevLogEntry: last, PrevLogTerm: term,
			Entries:           []*raft.Log{{Index: last + 1, Term: term + 200, Type: raft.LogCommand, Data: evil}},
			LeaderCommitIndex: last + 1,
		}
		var appResp raft.AppendEntriesResponse
		aerr := trans.AppendEntries(raft.ServerID(target.id), raft.ServerAddress(target.node.Addr()), app, &appResp)
		_ = trans.Close()
		if verr == nil || voteResp.Granted {
			t.Errorf("%s: vote request answered (granted=%v, err=%v); the handshake should refuse it", name, voteResp.Granted, verr)
		}
		if aerr == nil || appResp.Success {
			t.Errorf("%s: append entries answered (success=%v, err=%v); the handshake should refuse it", name, appResp.Success, aerr)
		}
	}
	if got := target.node.Raft().CurrentTerm(); got >= term+100 {
		t.Errorf("%s's term jumped from %d to %d: a rogue RPC got through", target.id, term, got)
	}
	for _, m := range members {
		ws, _ := m.rep.st.Workers()
		if len(ws) != 1 || ws[0].URL != "http://w1:8000" {
			t.Errorf("%s's worker set changed to %v", m.id, ws)
		}
	}
	// Each refusal is in the audit log with the rogue's address.
	testkit.WaitFor(t, 5*time.Second, "audit lines for the refused connections", func() bool {
		out := logBuf.String()
		return strings.Contains(out, "inbound peer failed authentication") && strings.Contains(out, "audit=true") &&
			strings.Contains(out, "remote=127.0.0.1:") && strings.Contains(out, `claimed_id=probe`)
	})
	if errs := fatals.all(); len(errs) > 0 {
		t.Errorf("unexpected Fatal calls: %v", errs)
	}
}

// A connection that never completes the handshake is closed at the
// deadline and stops counting against the cap.
func TestHandshakeDeadlineClosesSilentConnection(t *testing.T) {
	s := authStream(t, testToken, streamOptions{handshakeTimeout: 150 * time.Millisecond, log: testLogger(t)})
	conn, err := net.Dial("tcp", s.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err == nil {
		t.Fatal("read data from a listener that should have closed a silent connection")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("silent connection still open after %v", time.Since(start))
	}
	testkit.WaitFor(t, 5*time.Second, "the closed connection to leave the count", func() bool { return s.inboundCount() == 0 })
}

// Beyond the cap, new connections are closed at once; freeing a slot
// admits the next one, and a genuine peer then completes the handshake.
func TestConnectionCap(t *testing.T) {
	const max = 4
	logBuf := &testkit.SyncBuffer{}
	log := slog.New(slog.NewTextHandler(logBuf, nil))
	s := authStream(t, testToken, streamOptions{handshakeTimeout: time.Minute, maxInbound: max, log: log})
	addr := s.ln.Addr().String()
	var held []net.Conn
	defer func() {
		for _, c := range held {
			_ = c.Close()
		}
	}()
	for range max {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	testkit.WaitFor(t, 5*time.Second, "the cap to fill", func() bool { return s.inboundCount() == max })
	extra, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	_ = extra.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := extra.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("connection beyond the cap: read %v; want it closed at once", err)
	}
	if s.inboundCount() != max {
		t.Errorf("inbound = %d, want %d", s.inboundCount(), max)
	}
	testkit.WaitFor(t, 5*time.Second, "the refusal at the cap in the log", func() bool {
		return strings.Contains(logBuf.String(), "inbound connection cap reached")
	})
	_ = held[0].Close()
	held = held[1:]
	testkit.WaitFor(t, 5*time.Second, "a slot to free", func() bool { return s.inboundCount() == max-1 })

	peer := authStream(t, testToken, streamOptions{log: log})
	done := make(chan error, 1)
	go func() {
		c, err := s.Accept()
		if err == nil {
			_ = c.Close()
		}
		done <- err
	}()
	c, err := peer.Dial(raft.ServerAddress(addr), 5*time.Second)
	if err != nil {
		t.Fatalf("genuine peer after a slot freed: %v", err)
	}
	_ = c.Close()
	if err := <-done; err != nil {
		t.Fatalf("accept: %v", err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Refusals are rate limited; what was dropped is counted in the next line.
func TestLimitedLog(t *testing.T) {
	buf := &testkit.SyncBuffer{}
	l := newLimitedLog(slog.New(slog.NewTextHandler(buf, nil)), 2, 1)
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	for range 10 {
		l.Warn("refused", "remote", "10.0.0.1:1")
	}
	if n := strings.Count(buf.String(), "refused"); n != 2 {
		t.Fatalf("%d lines in a burst of 10 with burst 2", n)
	}
	now = now.Add(1500 * time.Millisecond)
	l.Warn("refused", "remote", "10.0.0.1:1")
	if !strings.Contains(buf.String(), "suppressed_since_last=8") {
		t.Errorf("suppressed count missing:\n%s", buf.String())
	}
}
