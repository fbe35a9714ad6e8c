package raftnode

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/raft-wal/metadb"
)

func TestLogKind(t *testing.T) {
	cases := []struct {
		name          string
		bolt, wal     bool
		emptyWALDir   bool
		want, kind    string
		errorContains string
	}{
		{name: "new dir, default", want: "", kind: LogStoreWAL},
		{name: "new dir, auto", want: LogStoreAuto, kind: LogStoreWAL},
		{name: "new dir, wal", want: LogStoreWAL, kind: LogStoreWAL},
		{name: "new dir, bolt", want: LogStoreBolt, kind: LogStoreBolt},
		{name: "new dir, unknown", want: "rocksdb", errorContains: `unknown log store "rocksdb"`},
		{name: "bolt dir, auto", bolt: true, want: LogStoreAuto, kind: LogStoreBolt},
		{name: "bolt dir, bolt", bolt: true, want: LogStoreBolt, kind: LogStoreBolt},
		{name: "bolt dir, wal", bolt: true, want: LogStoreWAL, errorContains: "holds a bolt log"},
		{name: "wal dir, auto", wal: true, want: LogStoreAuto, kind: LogStoreWAL},
		{name: "wal dir, bolt", wal: true, want: LogStoreBolt, errorContains: "holds a WAL"},
		// A WAL directory without its metadata file is a WAL that never
		// finished starting: it holds no entries.
		{name: "empty wal dir, bolt", emptyWALDir: true, want: LogStoreBolt, kind: LogStoreBolt},
		{name: "both", bolt: true, wal: true, want: LogStoreAuto, errorContains: "holds both"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if c.bolt {
				if err := os.WriteFile(filepath.Join(dir, raftDBFile), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if c.wal || c.emptyWALDir {
				if err := os.Mkdir(filepath.Join(dir, walDir), 0o700); err != nil {
					t.Fatal(err)
				}
			}
			if c.wal {
				if err := os.WriteFile(filepath.Join(dir, walDir, metadb.FileName), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			kind, err := logKind(dir, c.want)
			if c.errorContains != "" {
				if err == nil || !strings.Contains(err.Error(), c.errorContains) {
					t.Fatalf("logKind = %q, %v; want an error containing %q", kind, err, c.errorContains)
				}
				return
			}
			if err != nil || kind != c.kind {
				t.Fatalf("logKind = %q, %v; want %q", kind, err, c.kind)
			}
		})
	}
}

// The data dir lock makes a second opener fail at once, in this process
// too (flock locks belong to the open file, not the process), and is
// released by Close.
func TestDataDirLock(t *testing.T) {
	dir := t.TempDir()
	hlog := newHCLogAdapter(testLogger(t), "raft")
	d, err := openDisk(dir, LogStoreAuto, hlog)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	if _, err := HasExistingState(dir); err == nil || !strings.Contains(err.Error(), "is another node using it?") {
		t.Errorf("HasExistingState on a locked dir: %v, want the lock error", err)
	}
	if d2, err := openDisk(dir, LogStoreAuto, hlog); err == nil {
		_ = d2.Close()
		t.Fatal("a second open of a locked data dir succeeded")
	}
	if err := d.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	d3, err := openDisk(dir, LogStoreAuto, hlog)
	if err != nil {
		t.Fatalf("reopen after close: %v", err)
	}
	if err := d3.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
}
