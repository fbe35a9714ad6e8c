package raftnode

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"github.com/cartrouter/cart/controlplane/state"
)

// errHalted is what every entry after a fatal one gets: the node refuses
// to apply anything past an entry it could not apply.
var errHalted = errors.New("state machine halted after an entry it could not apply")

// fsm adapts *state.State to raft.FSM.
type fsm struct {
	st    *state.State
	fatal func(error)

	// halted is set when an entry could not be applied. Fatal normally ends
	// the process; when it does not (tests, or a Fatal that only alerts),
	// applying later entries on top of a skipped one would silently diverge
	// from the peers, so the adapter stops applying instead.
	halted   atomic.Bool
	restores atomic.Uint64 // snapshots installed, for tests and metrics

	// audit gets one line per committed membership change; lastConfig
	// is the previous configuration seen, for old -> new ("" = not seen
	// since start: restored from a snapshot or from before this process).
	audit      *slog.Logger
	lastConfig string
}

var (
	_ raft.FSM                = (*fsm)(nil)
	_ raft.ConfigurationStore = (*fsm)(nil)
)

// StoreConfiguration runs on raft's FSM goroutine for every committed
// configuration entry, on every node: the one place where all members see
// a voter join or leave, whoever asked for it.
func (f *fsm) StoreConfiguration(index uint64, c raft.Configuration) {
	now := configString(c)
	old := f.lastConfig
	f.lastConfig = now
	if f.audit == nil || old == now {
		return
	}
	if old == "" {
		old = "(unknown)"
	}
	f.audit.Info("audit: raft membership changed", "audit", true, "index", index, "old", old, "new", now)
}

func configString(c raft.Configuration) string {
	parts := make([]string, len(c.Servers))
	for i, s := range c.Servers {
		parts[i] = fmt.Sprintf("%s@%s(%s)", s.ID, s.Address, suffrage(s.Suffrage))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// Apply runs on raft's FSM goroutine, one entry at a time. The returned
// value is what the proposer's ApplyFuture.Response yields: a state.Result,
// or an error for an entry that stopped the node.
func (f *fsm) Apply(l *raft.Log) any {
	// raft hands the FSM only command entries today; configuration and
	// barrier entries carry no state-machine data, so be explicit.
	if l.Type != raft.LogCommand {
		return nil
	}
	if f.halted.Load() {
		return fmt.Errorf("apply log index %d: %w", l.Index, errHalted)
	}
	res, err := f.st.Apply(l.Index, l.Data)
	if err != nil {
		err = fmt.Errorf("apply log index %d (term %d): %w", l.Index, l.Term, err)
		f.halted.Store(true)
		f.fatal(err)
		return err
	}
	return res
}

// Snapshot freezes the state under its lock (a copy-on-write view of the
// index, no pass over it) and leaves building and encoding the records to Persist, which raft runs concurrently
// with later applies.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	if f.halted.Load() {
		// A snapshot of a state that skipped an entry would let raft
		// truncate the log that proves it, and spread the damage to
		// followers that install it.
		return nil, fmt.Errorf("snapshot: %w", errHalted)
	}
	return &fsmSnapshot{snap: f.st.Capture()}, nil
}

// Restore replaces the state with a snapshot's. state.Restore validates the
// whole stream before swapping, so a bad snapshot leaves the old state.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	if err := f.st.Restore(rc); err != nil {
		return fmt.Errorf("restore snapshot: %w", err)
	}
	f.restores.Add(1)
	return nil
}

type fsmSnapshot struct {
	snap *state.Snapshot
}

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if err := s.snap.Write(sink); err != nil {
		// Cancel discards the partial file; its error adds nothing to the
		// write error that caused it.
		_ = sink.Cancel()
		return fmt.Errorf("persist snapshot %s: %w", sink.ID(), err)
	}
	if err := sink.Close(); err != nil {
		return fmt.Errorf("close snapshot %s: %w", sink.ID(), err)
	}
	return nil
}

// Release lets the index write in place again the pages the snapshot's
// frozen view shared (raft calls it once Persist is done).
func (s *fsmSnapshot) Release() { s.snap.Release() }
