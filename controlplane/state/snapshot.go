package state

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"

	"google.golang.org/protobuf/proto"

	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// SnapshotVersion is the snapshot format version. 2 added the origin
// records after the index records: a node of version 1 refuses such a
// snapshot by its version rather than as trailing data; version 1
// snapshots (no origins) still restore.
const SnapshotVersion = 2

// maxRecordBytes bounds one length-delimited record, so a corrupt snapshot
// cannot make Restore allocate gigabytes.
const maxRecordBytes = 64 << 20

func indexID(id uint32) index.WorkerID { return index.WorkerID(id) }

// Snapshot is a frozen copy of the state: the small parts are copied under
// the lock, the index is a copy-on-write view of it (index.Freeze), so
// taking one holds the routing lock for a few microseconds per 64k entries
// instead of a pass over the index. Records are built and written out
// later, outside the lock, while applies and routing continue.
type Snapshot struct {
	header *cartv1.SnapshotHeader
	view   *index.View
	pos    map[index.WorkerID]uint32 // index worker id -> position in header.Workers
	// fix holds the uncommitted changes to take out of the view, by hash.
	fix map[uint64]holderChanges
	// origins are the Responses API origins, written after the index.
	origins []*cartv1.StoredOrigin
}

// Capture freezes the state. It holds the lock only to copy the worker
// set, the node directory, the ledger's uncommitted changes and the
// index's page table; Write does the per-entry work. Call Release when the
// snapshot will not be written again.
func (s *State) Capture() (snap *Snapshot) {
	s.dec.Do(decider.OpSnapshotCapture, func(eng *engine.Engine) { snap = s.capture(eng) })
	// Off the routing lock: the origins have a lock of their own, and
	// listing up to their bound (100,000 by default) is not O(1).
	if s.origins != nil {
		snap.origins = s.origins.Stored()
	}
	return snap
}

func (s *State) capture(eng *engine.Engine) *Snapshot {
	h := &cartv1.SnapshotHeader{
		Version:        SnapshotVersion,
		WorkersVersion: s.workersVersion,
		Members:        maps.Clone(s.members),
		AppliedIndex:   s.applied,
	}
	pos := make(map[index.WorkerID]uint32, len(s.specs))
	for i, w := range s.specs {
		h.Workers = append(h.Workers, &cartv1.WorkerSpec{Url: w.URL, MaxLoad: uint32(w.MaxLoad), MaxConcurrency: uint32(w.MaxConcurrency), LoadPenalty: uint32(w.LoadPenalty), CacheCapacityTokens: s.capacity[w.URL], Source: w.Source, Role: roleName(w.Role)})
		if id, ok := eng.WorkerIDOf(w.URL); ok {
			pos[indexID(id)] = uint32(i)
		}
	}
	// A leader's index runs ahead of the log by the placements it has not
	// committed yet; the snapshot stands for the log up to s.applied, so
	// those are taken back out of the copy (and withdrawals not committed
	// put back), or a restart or a follower installing it could keep
	// placements that never commit.
	return &Snapshot{header: h, view: eng.Index().Freeze(), pos: pos, fix: s.uncommitted(eng, pos)}
}

// Release lets the index write in place the pages this snapshot shared.
// The snapshot cannot be written afterwards.
func (snap *Snapshot) Release() { snap.view.Release() }

// records calls fn with each index record of the snapshot, in LRU order
// (most recent first) and then the entries only the ledger's undo adds.
// r is reused between calls: fn must not keep it.
func (snap *Snapshot) records(fn func(r *cartv1.IndexRecord) error) error {
	var r cartv1.IndexRecord
	var err error
	var seen map[uint64]bool
	if len(snap.fix) > 0 {
		seen = make(map[uint64]bool, len(snap.fix))
	}
	werr := snap.view.Walk(func(hash uint64, used int64, holders []index.Holder) bool {
		r.Hash, r.UsedUnixNanos = hash, used
		r.Workers, r.AtUnixNanos = r.Workers[:0], r.AtUnixNanos[:0]
		for _, hd := range holders {
			p, ok := snap.pos[hd.Worker]
			if !ok {
				continue
			}
			r.Workers = append(r.Workers, p)
			r.AtUnixNanos = append(r.AtUnixNanos, hd.At)
		}
		if changes, ok := snap.fix[hash]; ok {
			seen[hash] = true
			changes.apply(&r)
		}
		if len(r.Workers) > 0 {
			err = fn(&r)
		}
		return err == nil
	})
	if err != nil {
		return err
	}
	if werr != nil {
		return werr
	}
	// In hash order, so that both passes of Write agree and the output is
	// deterministic.
	extra := make([]uint64, 0, len(snap.fix)-len(seen))
	for hash := range snap.fix {
		if !seen[hash] {
			extra = append(extra, hash)
		}
	}
	slices.Sort(extra)
	for _, hash := range extra {
		r.Hash = hash
		r.Workers, r.AtUnixNanos = r.Workers[:0], r.AtUnixNanos[:0]
		snap.fix[hash].apply(&r)
		if len(r.Workers) > 0 {
			r.UsedUnixNanos = slices.Max(r.AtUnixNanos)
			if err := fn(&r); err != nil {
				return err
			}
		}
	}
	return nil
}

// holderChange is one uncommitted change to take out of a snapshot.
type holderChange struct {
	insert bool
	worker uint32 // position in the snapshot's worker list
	at     int64
}

type holderChanges []holderChange

func (cs holderChanges) apply(r *cartv1.IndexRecord) {
	for _, c := range cs {
		i := slices.Index(r.Workers, c.worker)
		switch {
		case c.insert && i < 0:
			r.Workers = append(r.Workers, c.worker)
			r.AtUnixNanos = append(r.AtUnixNanos, c.at)
		case !c.insert && i >= 0:
			r.Workers = slices.Delete(r.Workers, i, i+1)
			r.AtUnixNanos = slices.Delete(r.AtUnixNanos, i, i+1)
		}
	}
}

// uncommitted collects the ledger's changes by block hash. Inside the
// decider's critical section.
func (s *State) uncommitted(eng *engine.Engine, pos map[index.WorkerID]uint32) map[uint64]holderChanges {
	if s.own == nil {
		return nil
	}
	var fix map[uint64]holderChanges
	s.own.Uncommitted(eng, func(insert bool, worker string, hashes []uint64, at int64) {
		id, ok := eng.WorkerIDOf(worker)
		if !ok {
			return
		}
		p, ok := pos[indexID(id)]
		if !ok {
			return
		}
		if fix == nil {
			fix = map[uint64]holderChanges{}
		}
		for _, h := range hashes {
			fix[h] = append(fix[h], holderChange{insert: insert, worker: p, at: at})
		}
	})
	return fix
}

// Write streams the snapshot: the header, then each index record, each
// length-delimited. It reads the frozen view twice, once to count the
// records for the header and once to write them, rather than holding a
// decoded copy of a million records in memory.
func (snap *Snapshot) Write(w io.Writer) error {
	n := uint64(0)
	if err := snap.records(func(*cartv1.IndexRecord) error { n++; return nil }); err != nil {
		return fmt.Errorf("write snapshot: %w", err)
	}
	h := proto.CloneOf(snap.header)
	h.IndexRecords = n
	h.OriginRecords = uint64(len(snap.origins))
	bw := bufio.NewWriterSize(w, 256<<10)
	var buf []byte
	write := func(m proto.Message) error {
		var err error
		buf, err = proto.MarshalOptions{}.MarshalAppend(buf[:0], m)
		if err != nil {
			return err
		}
		var n [binary.MaxVarintLen64]byte
		if _, err := bw.Write(n[:binary.PutUvarint(n[:], uint64(len(buf)))]); err != nil {
			return err
		}
		_, err = bw.Write(buf)
		return err
	}
	if err := write(h); err != nil {
		return fmt.Errorf("write snapshot header: %w", err)
	}
	written := uint64(0)
	if err := snap.records(func(r *cartv1.IndexRecord) error {
		written++
		if err := write(r); err != nil {
			return fmt.Errorf("write snapshot record: %w", err)
		}
		return nil
	}); err != nil {
		return err
	}
	if written != n {
		// Only a view changing under us could do this; a header that
		// lies about the count would make the snapshot unreadable.
		return fmt.Errorf("write snapshot: counted %d records, wrote %d", n, written)
	}
	for _, o := range snap.origins {
		if err := write(o); err != nil {
			return fmt.Errorf("write snapshot origin: %w", err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("flush snapshot: %w", err)
	}
	return nil
}

// Restore replaces the whole state with a snapshot's. It decodes and checks
// everything before it changes anything, so a bad snapshot leaves the
// current state untouched (all or nothing); the install then runs in short
// lock holds, between which a reader sees a partial index.
func (s *State) Restore(r io.Reader) error {
	br := bufio.NewReaderSize(r, 256<<10)
	var h cartv1.SnapshotHeader
	if err := readRecord(br, &h); err != nil {
		return fmt.Errorf("snapshot header: %w", err)
	}
	if h.GetVersion() == 0 || h.GetVersion() > SnapshotVersion {
		return fmt.Errorf("snapshot version %d not supported (max %d)", h.GetVersion(), SnapshotVersion)
	}
	if h.GetVersion() < 2 && h.GetOriginRecords() > 0 {
		// Version 1 had no origin records: a header that says otherwise
		// was not written by this code.
		return fmt.Errorf("snapshot version %d with %d origin records (origins came in version 2)", h.GetVersion(), h.GetOriginRecords())
	}
	// Decoded entries are kept flat and pointer-free until installed: a
	// million decoded messages were three million objects for the garbage
	// collector to mark while the install ran, and its mark assists
	// stretched the install's lock holds.
	// A corrupt header must not make us allocate for a count it lies
	// about: preallocate at most a million, append grows beyond.
	n := min(h.GetIndexRecords(), 1<<20)
	records := make([]flatRecord, 0, n)
	holders := make([]flatHolder, 0, n)
	rec := &cartv1.IndexRecord{}
	for i := uint64(0); i < h.GetIndexRecords(); i++ {
		proto.Reset(rec)
		if err := readRecord(br, rec); err != nil {
			return fmt.Errorf("snapshot record %d of %d: %w", i, h.GetIndexRecords(), err)
		}
		if len(rec.GetWorkers()) != len(rec.GetAtUnixNanos()) {
			return fmt.Errorf("snapshot record %d: %d holders but %d times", i, len(rec.GetWorkers()), len(rec.GetAtUnixNanos()))
		}
		for j, p := range rec.GetWorkers() {
			if int(p) >= len(h.GetWorkers()) {
				return fmt.Errorf("snapshot record %d: holder %d out of range (%d workers)", i, p, len(h.GetWorkers()))
			}
			holders = append(holders, flatHolder{pos: p, at: rec.GetAtUnixNanos()[j]})
		}
		records = append(records, flatRecord{hash: rec.GetHash(), used: rec.GetUsedUnixNanos(), end: len(holders)})
	}
	origins := make([]*cartv1.StoredOrigin, 0, min(h.GetOriginRecords(), 1<<20))
	for i := uint64(0); i < h.GetOriginRecords(); i++ {
		o := &cartv1.StoredOrigin{}
		if err := readRecord(br, o); err != nil {
			return fmt.Errorf("snapshot origin %d of %d: %w", i, h.GetOriginRecords(), err)
		}
		origins = append(origins, o)
	}
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		return errors.New("snapshot has trailing data")
	}
	if s.origins != nil {
		s.origins.Restore(origins)
	}

	// The entries go in restoreChunk at a time, each chunk its own lock
	// hold: a million of them in one hold stalled routing for 170 ms-1.2 s.
	// Raft calls Restore on its FSM goroutine, so no log entry is applied
	// between the chunks; a reader between them (a dry run, Stats) sees a
	// partial index, which only costs it matches.
	var ids []index.WorkerID
	// The index's hash table for the records, allocated before the lock: filled
	// from empty it would grow under the chunks.
	room := s.dec.ReserveIndex(len(records))
	s.dec.Do(decider.OpSnapshotRestore, func(eng *engine.Engine) { ids = s.installHeader(eng, &h, room) })
	put := make([]index.Holder, 0, 8)
	from := 0
	s.dec.Steps(decider.OpSnapshotRestore, func(eng *engine.Engine) bool {
		chunk := records[:min(restoreChunk, len(records))]
		records = records[len(chunk):]
		idx := eng.Index()
		for _, r := range chunk {
			put = put[:0]
			for _, fh := range holders[from:r.end] {
				put = append(put, index.Holder{Worker: ids[fh.pos], At: fh.at})
			}
			from = r.end
			idx.PutBack(r.hash, r.used, put)
		}
		return len(records) == 0
	})
	return nil
}

// flatRecord is a decoded index record; its holders are flatHolders up to
// end (from the previous record's end).
type flatRecord struct {
	hash uint64
	used int64
	end  int
}

// flatHolder is a holder by its position in the snapshot's worker list.
type flatHolder struct {
	pos uint32
	at  int64
}

// restoreChunk is how many index records one lock hold of Restore puts
// back: most holds take 100-250 µs of wall time on a 1M-entry snapshot
// (BenchmarkRestoreStall; 2048 held up to 2.5-10 ms while the garbage
// collector marked).
const restoreChunk = 512

// installHeader empties the index and installs a decoded snapshot's worker
// set and metadata, returning the index id of each of its workers by
// position. Inside the decider's critical section.
func (s *State) installHeader(eng *engine.Engine, h *cartv1.SnapshotHeader, room *index.Reserved) []index.WorkerID {
	// Empty the index before replacing the workers: SetWorkers drops each
	// removed worker's entries with a walk over the whole index, for
	// entries about to be discarded anyway. ClearIndex empties the models
	// beside it too, without a pass over the entries.
	eng.ClearIndex(room)
	s.specs = s.specs[:0]
	s.capacity = map[string]int64{}
	for _, w := range h.GetWorkers() {
		s.specs = append(s.specs, s.specFrom(eng, w))
		s.capacity[w.GetUrl()] = w.GetCacheCapacityTokens()
	}
	eng.SetWorkers(slices.Clone(s.specs))
	ids := make([]index.WorkerID, len(s.specs))
	for i, w := range s.specs {
		id, _ := eng.WorkerIDOf(w.URL)
		ids[i] = indexID(id)
	}
	if s.own != nil {
		s.own.Restored()
	}
	s.workersVersion = h.GetWorkersVersion()
	s.applied = h.GetAppliedIndex()
	s.members = h.GetMembers()
	if s.members == nil {
		s.members = map[string]string{}
	}
	return ids
}

func readRecord(br *bufio.Reader, m proto.Message) error {
	n, err := binary.ReadUvarint(br)
	if err != nil {
		return fmt.Errorf("read length: %w", err)
	}
	if n > maxRecordBytes {
		return fmt.Errorf("record of %d bytes exceeds the %d-byte limit", n, maxRecordBytes)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(br, buf); err != nil {
		return fmt.Errorf("read record: %w", err)
	}
	return proto.Unmarshal(buf, m)
}
