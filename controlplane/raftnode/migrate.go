package raftnode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/hashicorp/raft-wal/metadb"
)

// MigrateResult says what MigrateToWAL copied.
type MigrateResult struct {
	First, Last uint64 // the log's index range (0, 0 for an empty log)
	Entries     uint64
	// Backup is where raft.db was moved; delete it once the node runs.
	Backup string
}

// stableKeys are every key hashicorp/raft keeps in its stable store
// (CART stores nothing else there): the term, and the vote cast in it.
var (
	stableUintKeys = [][]byte{[]byte("CurrentTerm"), []byte("LastVoteTerm")}
	stableKeys     = [][]byte{[]byte("LastVoteCand")}
)

const (
	walTmpDir      = walDir + ".migrating"
	migratedSuffix = ".migrated"
	migrateBatch   = 1 << 20 // bytes of entries per WAL append
)

// MigrateToWAL moves the bolt log of a stopped node's data dir to a WAL:
// it copies every entry and the stable store into wal.migrating/, checks
// the copy against the source, renames it to wal/, and only then moves
// raft.db aside (to raft.db.migrated), so an interruption at any point
// leaves either the bolt log alone, or both (which Start refuses to guess
// about and names), never neither. Snapshots are untouched: both stores
// share them.
func MigrateToWAL(ctx context.Context, dataDir string, log *slog.Logger) (MigrateResult, error) {
	var res MigrateResult
	lock, err := lockDataDir(dataDir)
	if err != nil {
		return res, err
	}
	defer lock.Close()
	kind, err := logKind(dataDir, LogStoreAuto)
	if err != nil {
		return res, err
	}
	if kind != LogStoreBolt {
		return res, fmt.Errorf("raftnode: data dir %s holds no bolt log (%s): nothing to migrate", dataDir, raftDBFile)
	}
	bolt, err := openBolt(dataDir)
	if err != nil {
		return res, err
	}
	defer bolt.Close()

	tmp := filepath.Join(dataDir, walTmpDir)
	// A leftover of an interrupted migration: its copy is incomplete.
	if err := os.RemoveAll(tmp); err != nil {
		return res, fmt.Errorf("raftnode: remove %s: %w", tmp, err)
	}
	hlog := newHCLogAdapter(log, "raft")
	disk := &diskStores{meta: &metadb.BoltMetaDB{}}
	if disk.wal, err = openWAL(dataDir, walTmpDir, disk.meta, hlog); err != nil {
		_ = disk.Close()
		return res, err
	}
	if res, err = copyLog(ctx, disk.wal, bolt); err == nil {
		err = copyStable(disk.wal, bolt)
	}
	if err == nil {
		err = sameLog(ctx, disk.wal, bolt, res)
	}
	if cerr := disk.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return res, fmt.Errorf("raftnode: migrate %s to a WAL (raft.db is unchanged): %w", dataDir, err)
	}
	// The WAL syncs its files; their names in its directory are synced
	// here, before the directory takes the name a node starts from.
	if err := syncDir(tmp); err != nil {
		return res, err
	}
	if err := os.Rename(tmp, filepath.Join(dataDir, walDir)); err != nil {
		return res, fmt.Errorf("raftnode: move the migrated WAL into place (raft.db is unchanged): %w", err)
	}
	if err := syncDir(dataDir); err != nil {
		return res, err
	}
	res.Backup = filepath.Join(dataDir, raftDBFile+migratedSuffix)
	if err := os.Rename(filepath.Join(dataDir, raftDBFile), res.Backup); err != nil {
		return res, fmt.Errorf("raftnode: the WAL is in place but raft.db could not be moved aside (move it yourself before starting the node): %w", err)
	}
	return res, syncDir(dataDir)
}

// copyLog appends every entry of src to the empty dst, in batches.
func copyLog(ctx context.Context, dst, src raft.LogStore) (MigrateResult, error) {
	var res MigrateResult
	first, err := src.FirstIndex()
	if err != nil {
		return res, fmt.Errorf("first index: %w", err)
	}
	last, err := src.LastIndex()
	if err != nil {
		return res, fmt.Errorf("last index: %w", err)
	}
	res.First, res.Last = first, last
	if last == 0 {
		return res, nil // an empty log
	}
	var batch []*raft.Log
	size := 0
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if err := dst.StoreLogs(batch); err != nil {
			return fmt.Errorf("append entries %d-%d: %w", batch[0].Index, batch[len(batch)-1].Index, err)
		}
		res.Entries += uint64(len(batch))
		batch, size = batch[:0], 0
		return nil
	}
	for i := first; i <= last; i++ {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		e := new(raft.Log)
		if err := src.GetLog(i, e); err != nil {
			return res, fmt.Errorf("read entry %d: %w", i, err)
		}
		batch = append(batch, e)
		if size += len(e.Data) + len(e.Extensions); size >= migrateBatch {
			if err := flush(); err != nil {
				return res, err
			}
		}
	}
	return res, flush()
}

// copyStable copies the keys src holds; a key never set (raft-boltdb's
// ErrKeyNotFound, which raft itself reads as zero) stays unset.
func copyStable(dst, src raft.StableStore) error {
	for _, k := range stableUintKeys {
		v, err := src.GetUint64(k)
		if err != nil && !errors.Is(err, raftboltdb.ErrKeyNotFound) {
			return fmt.Errorf("read %s: %w", k, err)
		}
		if err == nil {
			if err := dst.SetUint64(k, v); err != nil {
				return fmt.Errorf("write %s: %w", k, err)
			}
		}
	}
	for _, k := range stableKeys {
		v, err := src.Get(k)
		if err != nil && !errors.Is(err, raftboltdb.ErrKeyNotFound) {
			return fmt.Errorf("read %s: %w", k, err)
		}
		if err == nil {
			if err := dst.Set(k, v); err != nil {
				return fmt.Errorf("write %s: %w", k, err)
			}
		}
	}
	return nil
}

// sameLog checks the copy entry by entry (an offline, one-off pass over
// at most TrailingLogs+SnapshotThreshold entries).
func sameLog(ctx context.Context, dst, src raft.LogStore, res MigrateResult) error {
	first, err := dst.FirstIndex()
	if err != nil {
		return err
	}
	last, err := dst.LastIndex()
	if err != nil {
		return err
	}
	if first != res.First || last != res.Last || (last != 0 && res.Entries != last-first+1) {
		return fmt.Errorf("copy holds entries %d-%d (%d copied), the source %d-%d", first, last, res.Entries, res.First, res.Last)
	}
	for i := first; last != 0 && i <= last; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		var a, b raft.Log
		if err := src.GetLog(i, &a); err != nil {
			return fmt.Errorf("read entry %d: %w", i, err)
		}
		if err := dst.GetLog(i, &b); err != nil {
			return fmt.Errorf("read the copy's entry %d: %w", i, err)
		}
		if a.Term != b.Term || a.Type != b.Type || !bytes.Equal(a.Data, b.Data) || !bytes.Equal(a.Extensions, b.Extensions) {
			return fmt.Errorf("the copy's entry %d differs from the source's", i)
		}
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("raftnode: open %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("raftnode: sync %s: %w", dir, err)
	}
	return nil
}
