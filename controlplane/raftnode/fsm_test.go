package raftnode

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/cartrouter/cart/controlplane/state"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
)

func encode(t *testing.T, cmd *cartv1.RaftCommand) []byte {
	t.Helper()
	b, err := state.Encode(cmd)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func commandLog(index uint64, data []byte) *raft.Log {
	return &raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: data}
}

// An entry the node cannot apply stops it (Fatal) instead of being skipped,
// and nothing after it is applied: skipping would silently diverge from
// the peers that did apply it.
func TestFSMStopsOnUnknownEntry(t *testing.T) {
	cases := map[string][]byte{
		"no body":         encode(t, &cartv1.RaftCommand{}),
		"newer version":   encode(t, &cartv1.RaftCommand{Version: state.CommandVersion + 1, Body: upsertCmd("http://w9:1", 0).Body}),
		"undecodable":     {0x0a, 0xff}, // a length prefix cut short
		"truncated entry": encode(t, upsertCmd("http://w9:1", 0))[:5],
	}
	for name, bad := range cases {
		t.Run(name, func(t *testing.T) {
			rep := newReplica()
			rec := &fatalRecorder{}
			f := &fsm{st: rep.st, fatal: rec.add}
			if _, ok := f.Apply(commandLog(1, encode(t, upsertCmd("http://w1:1", 0)))).(state.Result); !ok {
				t.Fatal("a valid entry was not applied")
			}
			resp := f.Apply(commandLog(2, bad))
			err, _ := resp.(error)
			if !errors.Is(err, state.ErrUnknownCommand) {
				t.Fatalf("response = %v, want ErrUnknownCommand", resp)
			}
			errs := rec.all()
			if len(errs) != 1 || !errors.Is(errs[0], state.ErrUnknownCommand) || !strings.Contains(errs[0].Error(), "index 2") {
				t.Fatalf("Fatal calls = %v, want one naming index 2", errs)
			}
			// Fatal returned (as it does in tests): the adapter still must
			// not apply past the bad entry, nor snapshot the gap away.
			if resp := f.Apply(commandLog(3, encode(t, upsertCmd("http://w2:1", 0)))); !errors.Is(resp.(error), errHalted) {
				t.Fatalf("entry after the bad one: %v, want errHalted", resp)
			}
			if ws, _ := rep.st.Workers(); len(ws) != 1 || rep.st.Applied() != 1 {
				t.Fatalf("state moved past the bad entry: %v applied=%d", ws, rep.st.Applied())
			}
			if _, err := f.Snapshot(); !errors.Is(err, errHalted) {
				t.Fatalf("snapshot of a halted state machine: %v", err)
			}
		})
	}
}

// Entries flagged ignorable are skipped when not understood, and entries
// that carry no state-machine data are ignored.
func TestFSMSkipsIgnorableAndNonCommandEntries(t *testing.T) {
	rep := newReplica()
	rec := &fatalRecorder{}
	f := &fsm{st: rep.st, fatal: rec.add}
	f.Apply(commandLog(1, encode(t, upsertCmd("http://w1:1", 0))))
	if _, ok := f.Apply(commandLog(2, encode(t, &cartv1.RaftCommand{Ignorable: true}))).(state.Result); !ok {
		t.Fatal("ignorable entry without body not skipped")
	}
	newer := &cartv1.RaftCommand{Version: state.CommandVersion + 1, Ignorable: true, Body: upsertCmd("http://w2:1", 0).Body}
	if _, ok := f.Apply(commandLog(3, encode(t, newer))).(state.Result); !ok {
		t.Fatal("ignorable entry of a newer version not skipped")
	}
	for i, typ := range []raft.LogType{raft.LogNoop, raft.LogBarrier, raft.LogConfiguration} {
		if resp := f.Apply(&raft.Log{Index: uint64(4 + i), Type: typ, Data: []byte{0xff}}); resp != nil {
			t.Errorf("%v entry: response %v", typ, resp)
		}
	}
	if errs := rec.all(); len(errs) != 0 {
		t.Fatalf("Fatal called: %v", errs)
	}
	if ws, _ := rep.st.Workers(); len(ws) != 1 || ws[0].URL != "http://w1:1" {
		t.Errorf("workers = %v", ws)
	}
	if got := rep.st.Applied(); got != 3 {
		t.Errorf("applied = %d, want 3 (the skipped entries count as applied)", got)
	}
	// A good entry after skipped ones still applies.
	f.Apply(commandLog(10, encode(t, upsertCmd("http://w3:1", 0))))
	if ws, _ := rep.st.Workers(); len(ws) != 2 {
		t.Errorf("workers after skips = %v", ws)
	}
}

// Through raft: a committed entry the leader cannot apply reaches Fatal,
// and the proposer is told the write was not applied.
func TestNodeCallsFatalOnUnknownEntry(t *testing.T) {
	_, trans := raft.NewInmemTransport("")
	rep := newReplica()
	rec := &fatalRecorder{}
	n, err := Start(Config{NodeID: "solo", Bootstrap: true, Transport: trans, Timeouts: &fastTimeouts, Logger: testLogger(t), Fatal: rec.add}, rep.st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Shutdown()
	testkit.WaitFor(t, 5*time.Second, "leader", n.IsLeader)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := n.Apply(ctx, &cartv1.RaftCommand{Ignorable: true}); err != nil {
		t.Fatalf("ignorable entry: %v", err)
	}
	if len(rec.all()) != 0 {
		t.Fatal("Fatal called for an ignorable entry")
	}
	_, err = n.Apply(ctx, &cartv1.RaftCommand{RequestId: "bad"})
	if !errors.Is(err, state.ErrUnknownCommand) {
		t.Fatalf("apply of an entry without body: %v, want ErrUnknownCommand", err)
	}
	if errs := rec.all(); len(errs) != 1 {
		t.Fatalf("Fatal calls = %v, want 1", errs)
	}
	if _, err := n.Apply(ctx, upsertCmd("http://w1:1", 0)); !errors.Is(err, errHalted) {
		t.Fatalf("apply after the fatal entry: %v, want errHalted", err)
	}
	if ws, _ := rep.st.Workers(); len(ws) != 0 {
		t.Errorf("state advanced past the fatal entry: %v", ws)
	}
}

// Persist writes what Restore reads, and cancels the sink on failure.
func TestFSMSnapshotRoundTrip(t *testing.T) {
	rep := newReplica()
	f := &fsm{st: rep.st, fatal: func(err error) { t.Errorf("fatal: %v", err) }}
	r := rand.New(rand.NewPCG(11, 11))
	f.Apply(commandLog(1, encode(t, upsertCmd("http://w1:1", 3))))
	f.Apply(commandLog(2, encode(t, placeCmd(placement("http://w1:1", newPrompt(r, 6), 5)))))
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// Applies after Snapshot do not leak into it.
	f.Apply(commandLog(3, encode(t, upsertCmd("http://w2:1", 0))))
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil || !sink.closed || sink.cancelled {
		t.Fatalf("persist: %v closed=%v cancelled=%v", err, sink.closed, sink.cancelled)
	}
	snap.Release()

	other := newReplica()
	g := &fsm{st: other.st}
	if err := g.Restore(io.NopCloser(bytes.NewReader(sink.buf.Bytes()))); err != nil {
		t.Fatalf("restore: %v", err)
	}
	if g.restores.Load() != 1 {
		t.Error("restore not counted")
	}
	d := other.dump()
	if d.workers != "http://w1:1/3/0/1048576" || len(d.entries) != 6 {
		t.Errorf("restored state = %s", d)
	}

	failing := &memSink{failAfter: 10}
	if err := snap.Persist(failing); err == nil || !failing.cancelled || failing.closed {
		t.Errorf("failed persist: %v cancelled=%v closed=%v; want error and Cancel", err, failing.cancelled, failing.closed)
	}
}

// memSink is a raft.SnapshotSink in memory; failAfter > 0 makes writes
// fail past that many bytes.
type memSink struct {
	buf               bytes.Buffer
	failAfter         int
	closed, cancelled bool
}

func (s *memSink) Write(p []byte) (int, error) {
	if s.failAfter > 0 && s.buf.Len()+len(p) > s.failAfter {
		return 0, errors.New("disk full")
	}
	return s.buf.Write(p)
}
func (s *memSink) Close() error  { s.closed = true; return nil }
func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { s.cancelled = true; return nil }
