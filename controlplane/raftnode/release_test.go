package raftnode

import (
	"errors"
	"io"
	"log/slog"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// gatedFSM blocks its first Apply until gate closes, so later committed
// entries queue for the FSM.
type gatedFSM struct {
	once    sync.Once
	entered chan struct{}
	gate    chan struct{}
}

func (g *gatedFSM) Apply(*raft.Log) any {
	g.once.Do(func() {
		close(g.entered)
		<-g.gate
	})
	return nil
}

func (g *gatedFSM) Snapshot() (raft.FSMSnapshot, error) { return nil, errors.New("no snapshots") }
func (g *gatedFSM) Restore(io.ReadCloser) error         { return errors.New("no snapshots") }

// startGatedRaft starts a single-voter raft with in-memory stores and waits
// for it to lead.
func startGatedRaft(t *testing.T, fsm raft.FSM) *raft.Raft {
	t.Helper()
	conf := raft.DefaultConfig()
	conf.LocalID = "a"
	conf.HeartbeatTimeout = 50 * time.Millisecond
	conf.ElectionTimeout = 50 * time.Millisecond
	conf.LeaderLeaseTimeout = 50 * time.Millisecond
	conf.CommitTimeout = 5 * time.Millisecond
	conf.Logger = newHCLogAdapter(slog.New(slog.DiscardHandler), "raft")
	store := raft.NewInmemStore()
	snaps := raft.NewInmemSnapshotStore()
	addr, trans := raft.NewInmemTransport("a")
	if err := raft.BootstrapCluster(conf, store, store, snaps, trans, raft.Configuration{
		Servers: []raft.Server{{ID: "a", Address: addr}},
	}); err != nil {
		t.Fatal(err)
	}
	r, err := raft.NewRaft(conf, fsm, store, store, snaps, trans)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for r.State() != raft.Leader {
		if time.Now().After(deadline) {
			t.Fatal("no leader after 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return r
}

// raft drops the FSM's queue at shutdown without answering its futures
// (hashicorp/raft#498). Entries committed one at a time while the FSM is
// stuck queue as separate batches; at shutdown the FSM loop picks between
// its queue and the shutdown at random, so with 12 batches it drops at
// least one nearly always (all are applied with probability 2^-12). Every
// waiter must still return once the node's stop channel closes.
func TestWaitersOnDroppedFuturesAreReleased(t *testing.T) {
	fsm := &gatedFSM{entered: make(chan struct{}), gate: make(chan struct{})}
	r := startGatedRaft(t, fsm)
	stop := make(chan struct{})

	const n = 13
	results := make(chan error, n)
	for i := range n {
		f := r.Apply([]byte{byte(i)}, time.Second)
		if !releaseAtStop(f, stop) {
			t.Fatalf("apply future %T cannot be released", f)
		}
		go func() { results <- f.Error() }()
		if i == 0 {
			<-fsm.entered
		}
		// Wait for the commit so the next entry is its own FSM batch.
		want := r.LastIndex()
		for r.CommitIndex() < want {
			time.Sleep(time.Millisecond)
		}
	}

	shut := r.Shutdown()
	for r.State() != raft.Shutdown {
		time.Sleep(time.Millisecond)
	}
	close(fsm.gate) // the FSM loop now sees its queue and the shutdown
	if err := shut.Error(); err != nil {
		t.Fatal(err)
	}
	close(stop)

	var released int
	timeout := time.After(10 * time.Second)
	for range n {
		select {
		case err := <-results:
			if errors.Is(err, raft.ErrRaftShutdown) {
				released++
			} else if err != nil && !errors.Is(err, raft.ErrLeadershipLost) {
				t.Errorf("unexpected error: %v", err)
			}
		case <-timeout:
			t.Fatal("a waiter is still blocked 10 s after the node stopped")
		}
	}
	t.Logf("%d of %d waiters were released by the stop channel or raft's shutdown", released, n)
}

// Every kind of future raftnode waits on must be releasable, so a raft
// upgrade that drops ShutdownCh fails here rather than hanging shutdowns.
func TestEveryFutureKindCanBeReleased(t *testing.T) {
	r := startGatedRaft(t, &gatedFSM{entered: make(chan struct{}), gate: closedChan()})
	t.Cleanup(func() { _ = r.Shutdown().Error() })
	stop := make(chan struct{})
	futures := map[string]raft.Future{
		"apply":       r.Apply([]byte{1}, time.Second),
		"barrier":     r.Barrier(time.Second),
		"add voter":   r.AddVoter("a", "a", 0, time.Second),
		"remove":      r.RemoveServer("nobody", 0, time.Second),
		"transfer":    r.LeadershipTransfer(),
		"demote":      r.DemoteVoter("nobody", 0, time.Second),
		"nonvoter":    r.AddNonvoter("b", "b", 0, time.Second),
		"transfer to": r.LeadershipTransferToServer("b", "b"),
	}
	for name, f := range futures {
		answered := reflect.ValueOf(f).Kind() != reflect.Pointer // raft's errorFuture value
		if !releaseAtStop(f, stop) && !answered {
			t.Errorf("%s future %T cannot be released", name, f)
		}
		_ = f.Error()
	}
	if releaseAtStop(nil, stop) {
		t.Error("a nil future reported released")
	}
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// indexFuture is a resolved raft.IndexFuture with a given index.
type indexFuture struct {
	raft.IndexFuture
	index uint64
}

func (f indexFuture) Index() uint64 { return f.index }

// Raft's shutdown error after an entry was appended (a release at stop,
// or raft's own answer for a committed entry it could not apply) means
// the outcome is unknown; before it was appended, that it was not.
func TestShutdownErrorOfAnAppendedEntryIsOutcomeUnknown(t *testing.T) {
	n := newCluster(t, 1, clusterOpts{}).leader().node
	for _, c := range []struct {
		index   uint64
		unknown bool
	}{{0, false}, {17, true}} {
		err := n.mapAwaitErr("raft apply", indexFuture{index: c.index}, raft.ErrRaftShutdown)
		if got := errors.Is(err, ErrOutcomeUnknown); got != c.unknown {
			t.Errorf("index %d: %v; outcome unknown %v, want %v", c.index, err, got, c.unknown)
		}
		if !errors.Is(err, ErrNotLeader) {
			t.Errorf("index %d: %v, want ErrNotLeader wrapped (the caller retries on the leader)", c.index, err)
		}
	}
}
