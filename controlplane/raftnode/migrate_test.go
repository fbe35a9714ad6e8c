package raftnode

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
	"github.com/hashicorp/raft-wal/metadb"
)

// A node's bolt log moves to a WAL: the node restarts from it with the
// same state and term, leads again, and takes new entries; raft.db is kept
// aside, and a second run finds nothing to migrate.
func TestMigrateToWAL(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	cfg := Config{NodeID: "solo", BindAddr: "127.0.0.1:0", DataDir: dir, LogStore: LogStoreBolt, Bootstrap: true, Timeouts: &tcpTimeouts, Logger: testLogger(t)}
	rep := newReplica()
	n, err := Start(cfg, rep.st, nil)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	testkit.WaitFor(t, 5*time.Second, "bootstrap leader", n.IsLeader)
	apply := func(n *Node, url string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := n.Apply(ctx, upsertCmd(url, 4)); err != nil {
			t.Fatalf("apply: %v", err)
		}
	}
	apply(n, "http://w1:8000")
	if err := n.Raft().Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	apply(n, "http://w2:8000") // after the snapshot: only in the log
	cfg.BindAddr = n.Addr()
	before := rep.dump()
	if err := n.Shutdown(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	termBefore := stableTerm(t, dir, LogStoreBolt)

	// A leftover of an interrupted run is discarded, not trusted.
	if err := os.MkdirAll(filepath.Join(dir, walTmpDir), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, walTmpDir, "junk"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := MigrateToWAL(context.Background(), dir, testLogger(t))
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if res.Entries == 0 || res.Entries != res.Last-res.First+1 {
		t.Fatalf("migrate copied %+v", res)
	}
	for _, p := range []string{filepath.Join(dir, walDir, metadb.FileName), res.Backup} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("after migrating: %v", err)
		}
	}
	for _, p := range []string{filepath.Join(dir, raftDBFile), filepath.Join(dir, walTmpDir)} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after migrating, %s: %v, want it gone", p, err)
		}
	}
	if got := stableTerm(t, dir, LogStoreWAL); got != termBefore || got == 0 {
		t.Errorf("term after migrating = %d, want %d", got, termBefore)
	}

	rep2 := newReplica()
	cfg.Bootstrap, cfg.LogStore = false, LogStoreAuto
	n2, err := Start(cfg, rep2.st, nil)
	if err != nil {
		t.Fatalf("start on the migrated log: %v", err)
	}
	defer n2.Shutdown()
	testkit.WaitFor(t, 5*time.Second, "leadership on the migrated log", n2.IsLeader)
	if got := rep2.dump(); !got.equal(before) {
		t.Fatalf("state on the migrated log differs:\n got  %s\n want %s", got, before)
	}
	apply(n2, "http://w3:8000")
	if err := n2.Shutdown(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if _, err := MigrateToWAL(context.Background(), dir, testLogger(t)); err == nil || !strings.Contains(err.Error(), "nothing to migrate") {
		t.Errorf("second migration: %v, want nothing to migrate", err)
	}
}

// stableTerm reads the current term from dir's log store of the given kind.
func stableTerm(t *testing.T, dir, kind string) uint64 {
	t.Helper()
	d, err := openDisk(dir, kind, newHCLogAdapter(testLogger(t), "raft"))
	if err != nil {
		t.Fatalf("open %s: %v", kind, err)
	}
	defer d.Close()
	_, stable := d.store()
	v, err := stable.GetUint64([]byte("CurrentTerm"))
	if err != nil {
		t.Fatalf("read the term from %s: %v", kind, err)
	}
	return v
}
