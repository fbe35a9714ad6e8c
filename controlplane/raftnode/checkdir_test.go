package raftnode

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/raft-wal/metadb"
)

// CheckDataDir refuses what a start would (a path that cannot be a
// directory, the other kind of log), accepts what it would, and creates
// nothing.
func TestCheckDataDir(t *testing.T) {
	root := t.TempDir()
	file := filepath.Join(root, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	bolt := filepath.Join(root, "bolt")
	wal := filepath.Join(root, "wal")
	for _, d := range []string{bolt, filepath.Join(wal, walDir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(bolt, raftDBFile), filepath.Join(wal, walDir, metadb.FileName)} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		dir, store, want string // want: "" for accepted, else part of the error
	}{
		{filepath.Join(root, "new", "n1"), LogStoreAuto, ""},
		{file, LogStoreAuto, "not a directory"},
		{filepath.Join(file, "n1"), LogStoreAuto, "cannot be created"},
		{bolt, LogStoreAuto, ""},
		{bolt, LogStoreBolt, ""},
		{bolt, LogStoreWAL, "holds a bolt log"},
		{wal, LogStoreWAL, ""},
		{wal, LogStoreBolt, "holds a WAL"},
	} {
		err := CheckDataDir(tc.dir, tc.store)
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("CheckDataDir(%s, %s) = %v, want %q", tc.dir, tc.store, err, tc.want)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "new")); !os.IsNotExist(err) {
		t.Errorf("CheckDataDir created the data dir's parent: %v", err)
	}
}
