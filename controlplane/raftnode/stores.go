package raftnode

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"go.etcd.io/bbolt"
)

// Log stores a data directory can hold (Config.LogStore).
const (
	// LogStoreAuto keeps whichever log a data directory already holds and
	// starts a new one as a WAL.
	LogStoreAuto = "auto"
	// LogStoreWAL is hashicorp/raft-wal: append-only segment files, one
	// fsync per append, truncation by deleting whole segments.
	LogStoreWAL = "wal"
	// LogStoreBolt is hashicorp/raft-boltdb: a B-tree in raft.db, two
	// fsyncs per append, and a free list that every commit rewrites.
	LogStoreBolt = "bolt"
)

const (
	walDir   = "wal"
	lockFile = "LOCK"
)

// diskStores is what a node opened in its data directory; Close releases
// all of it, the directory lock last.
type diskStores struct {
	lock *os.File
	bolt *raftboltdb.BoltStore
	wal  *wal.WAL
	// meta is the WAL's metadata database. The WAL's Close leaves it open
	// (raft-wal v0.4.0), which would keep its bolt file locked until the
	// process exits, so it is passed in and closed here.
	meta *metadb.BoltMetaDB
}

func (d *diskStores) Close() error {
	if d == nil {
		return nil
	}
	var errs []error
	if d.bolt != nil {
		if err := d.bolt.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close raft log (bolt): %w", err))
		}
	}
	if d.wal != nil {
		if err := d.wal.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close raft log (wal): %w", err))
		}
	}
	if d.meta != nil {
		// After the WAL's Close nothing writes to it: Close waits for
		// writes, and Set/SetUint64 refuse a closed WAL.
		if err := d.meta.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close raft log metadata (wal): %w", err))
		}
	}
	if d.lock != nil {
		// Closing the descriptor drops the flock.
		if err := d.lock.Close(); err != nil {
			errs = append(errs, fmt.Errorf("release data dir lock: %w", err))
		}
	}
	return errors.Join(errs...)
}

// store returns the log and stable store, whichever kind is open.
func (d *diskStores) store() (raft.LogStore, raft.StableStore) {
	if d.wal != nil {
		return d.wal, d.wal
	}
	return d.bolt, d.bolt
}

// lockDataDir takes an exclusive, non-blocking lock on dir. raft-wal's
// metadata database opens bolt without a timeout, so without this a second
// process on the same directory would hang instead of failing.
func lockDataDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, lockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("raftnode: open %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("raftnode: lock data dir %s (is another node using it?): %w", dir, err)
	}
	return f, nil
}

// logKind decides which log store to open in dir: the one already there,
// or, for a directory without a log, the one asked for (WAL for auto). A
// directory's log is never switched silently: asking for the other kind
// is an error that says how to move.
func logKind(dir, want string) (string, error) {
	hasBolt, hasWAL, err := logsIn(dir)
	if err != nil {
		return "", err
	}
	const rejoin = "remove the node from the cluster, empty its data dir and join it again with controlplane.join, not bootstrap, which would start a second cluster (it receives the state from the leader)"
	switch {
	case hasBolt && hasWAL:
		return "", fmt.Errorf("raftnode: data dir %s holds both a bolt log (%s) and a WAL (%s/); remove the one that is not in use (after an interrupted `cart controlplane migrate-log`, the WAL is a complete, checked copy: move %s aside)", dir, raftDBFile, walDir, raftDBFile)
	case hasBolt && want == LogStoreWAL:
		return "", fmt.Errorf("raftnode: controlplane.log_store is %q but data dir %s holds a bolt log (%s); to move it to a WAL, stop the node and run `cart controlplane migrate-log -c <config>`, or %s", want, dir, raftDBFile, rejoin)
	case hasWAL && want == LogStoreBolt:
		return "", fmt.Errorf("raftnode: controlplane.log_store is %q but data dir %s holds a WAL (%s/); to move it to bolt, %s", want, dir, walDir, rejoin)
	case hasBolt:
		return LogStoreBolt, nil
	case hasWAL:
		return LogStoreWAL, nil
	case want == LogStoreBolt:
		return LogStoreBolt, nil
	case want == "", want == LogStoreAuto, want == LogStoreWAL:
		return LogStoreWAL, nil
	}
	return "", fmt.Errorf("raftnode: unknown log store %q (want %s, %s or %s)", want, LogStoreAuto, LogStoreWAL, LogStoreBolt)
}

// logsIn reports which log stores dir holds.
func logsIn(dir string) (hasBolt, hasWAL bool, err error) {
	if hasBolt, err = exists(filepath.Join(dir, raftDBFile)); err != nil {
		return false, false, err
	}
	// The WAL's metadata file is created atomically (renamed into place),
	// so its presence, not the directory's, says a WAL was started.
	hasWAL, err = exists(filepath.Join(dir, walDir, metadb.FileName))
	return hasBolt, hasWAL, err
}

func exists(path string) (bool, error) {
	_, err := os.Stat(path)
	if err == nil {
		return true, nil
	}
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return false, fmt.Errorf("raftnode: stat %s: %w", path, err)
}

// openDisk locks dir and opens its log store (see logKind).
func openDisk(dir, want string, hlog hclog.Logger) (*diskStores, error) {
	lock, err := lockDataDir(dir)
	if err != nil {
		return nil, err
	}
	d := &diskStores{lock: lock}
	kind, err := logKind(dir, want)
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	switch kind {
	case LogStoreBolt:
		d.bolt, err = openBolt(dir)
	default:
		d.meta = &metadb.BoltMetaDB{}
		d.wal, err = openWAL(dir, walDir, d.meta, hlog)
	}
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	return d, nil
}

func openWAL(dir, sub string, meta *metadb.BoltMetaDB, hlog hclog.Logger) (*wal.WAL, error) {
	path := filepath.Join(dir, sub)
	had, err := exists(path)
	if err != nil {
		return nil, err
	}
	if !had {
		if err := os.Mkdir(path, 0o700); err != nil {
			return nil, fmt.Errorf("raftnode: create %s: %w", path, err)
		}
		// The WAL syncs the files it creates in path, not path's own
		// name in dir.
		if err := syncDir(dir); err != nil {
			return nil, err
		}
	}
	w, err := wal.Open(path, wal.WithMetaStore(meta), wal.WithLogger(hlog.Named("wal")))
	if err != nil {
		return nil, fmt.Errorf("raftnode: open WAL in %s: %w", path, err)
	}
	return w, nil
}

// openBolt opens raft.db with a lock timeout, as a second guard besides
// the directory lock.
func openBolt(dir string) (*raftboltdb.BoltStore, error) {
	path := filepath.Join(dir, raftDBFile)
	bolt, err := raftboltdb.New(raftboltdb.Options{
		Path:        path,
		BoltOptions: &bbolt.Options{Timeout: boltOpenTimeout},
	})
	if err != nil {
		return nil, fmt.Errorf("raftnode: open %s (is another node using this data dir?): %w", path, err)
	}
	return bolt, nil
}
