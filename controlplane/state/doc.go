// Package state is the control plane's replicated state machine: the worker
// set, the node directory and the prefix index, changed only by log
// commands. It knows nothing of Raft (controlplane/raftnode adapts it) and
// does no I/O beyond the snapshot streams it is handed.
//
// The engine it mutates belongs to the node's decider (controlplane/decider),
// shared with the leader's router: every access runs inside the decider's
// critical section (Decider.Do), so routing decisions and log applies
// interleave but never overlap, and each hold is timed.
//
// The worker set, the node directory and the index change only by typed,
// versioned protobuf commands (RaftCommand). Unknown or undecodable entries
// stop the node (it must not diverge) unless flagged ignorable. Commands are
// idempotent: upserts, removes by URL, absolute worker sets, placements
// (insert refreshes). PlaceBatch, the one command every node applies at the
// routing rate, is read in place from the entry's bytes (placedecode.go: no
// message or slice per placement; 9.1-9.5 µs against proto.Unmarshal's 60-88
// µs for 64 placements of 100 blocks, BenchmarkDecodePlaceBatch,
// bench/results/2026-12-02-cpu/decode.txt); anything it is not sure of
// (another command, a newer version, an unknown field, invalid UTF-8) goes to
// proto.Unmarshal, and FuzzDecodePlaceBatch checks that what it takes decodes
// as proto.Unmarshal would.
//
// Placements arrive in PlaceBatch entries that the leader's batcher cuts
// (controlplane/service). Followers apply a batch in steps of at most 32
// placements and 128 blocks per lock hold (a placement is never split, so one
// long prompt is a step of its own, at most MaxRouteBlocks) so routing
// interleaves; withdrawal batches likewise; the leader skips batches it
// proposed itself (tagged with a per-process request id), whose placements it
// made at decision time.
//
// # Snapshots
//
// Snapshots freeze the index (index.Freeze: copy-on-write pages, see package
// index) with the worker set and the placement ledger's undo, instead of
// copying it under the engine lock. Records are built and streamed from the
// view off the lock, in two passes (count for the header, then write) instead
// of a decoded copy of every record (136 MB of garbage per snapshot before).
//
// Restore decodes and checks everything first (all or nothing), into flat,
// pointer-free arrays, then installs the worker set in one lock hold and the
// entries 512 per hold, yielding between holds (decider.Steps) so that a
// waiting decision gets the lock. Raft calls Restore on its FSM goroutine, so
// no entry is applied between the holds; a reader between them sees a partial
// index, and a daily reset that falls between two holds (the node's local
// decision) keeps only the part put back after it. At 1M entries (go test -run
// '^$' -bench BenchmarkRestoreStall -benchtime 3x ./controlplane/state/) the
// longest wait of a probe taking the lock fell from 680-765 ms (one hold) to
// 5.6-5.9 ms, p99 0.63-0.66 ms, and the restore from 680-750 to ~530 ms
// (bench/results/2026-12-01-final/restore-stall.txt, quiet box). The index's
// hash table for the records is allocated before the lock at their count (see
// package index, Allocation outside the lock).
package state
