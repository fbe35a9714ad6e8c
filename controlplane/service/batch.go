package service

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// batcher replicates the leader's placements in batches: one Raft entry
// every interval (or every max placements), instead of one per Route. A
// new leader's index lacks at most the last window, which only costs a few
// cache misses.
//
// The leader changes its own index at decision time, ahead of the log, so
// the batcher also keeps the ledger of those changes until they commit: a
// batch that fails to commit (leadership lost, not appended, gave up
// waiting) is undone, together with the window behind it, and forgotten,
// so that the index changes only by committed log commands in effect. If
// such a batch commits after all (a majority had it), this node applies it
// from the log like any follower.
type batcher struct {
	node     Node
	interval time.Duration
	max      int
	log      *slog.Logger
	full     chan struct{}
	nonce    uint64

	// lock is the engine lock: the ledger changes together with the index
	// it describes, so undoing a batch and applying a committed entry never
	// interleave. Everything below is guarded by it.
	lock *sync.Mutex
	eng  *engine.Engine

	window   []pendingOp              // decided, not yet proposed
	origins  []*cartv1.ResponseOrigin // learned, not yet proposed (never undone)
	inflight *ownBatch                // proposed, fate not known yet (one at a time)
	batches  uint64
	seq      uint64 // numbers pending ops, for fences
	// fence holds, for (worker, hash) pairs a committed entry of another
	// proposer touched while ops were pending, the last op seq at that
	// moment: ops up to it are superseded by the log and never undone.
	fence map[fenceKey]uint64
}

// pendingOp is one change this node made to its index ahead of the log.
type pendingOp struct {
	place  bool // placement; false = withdrawal
	worker string
	wid    uint32 // engine id at decision time: a worker removed and added again is another
	hashes []uint64
	at     int64
	seq    uint64
}

type ownBatch struct {
	id  string
	ops []pendingOp
}

type fenceKey struct {
	worker string
	hash   uint64
}

func newBatcher(n Node, interval time.Duration, maxN int, log *slog.Logger, lock *sync.Mutex, eng *engine.Engine) *batcher {
	if interval <= 0 {
		interval = 10 * time.Millisecond
	}
	if maxN <= 0 {
		maxN = 512
	}
	return &batcher{node: n, interval: interval, max: maxN, log: log, full: make(chan struct{}, 1), nonce: rand.Uint64(),
		lock: lock, eng: eng, fence: map[fenceKey]uint64{}}
}

// Own implements state.OwnBatches: requestID is the batch in flight, whose
// changes are already in the index. It is committed now, so its ops leave
// the ledger. Called with the engine lock held.
func (b *batcher) Own(requestID string) bool {
	if b.inflight == nil || b.inflight.id != requestID {
		return false
	}
	b.inflight = nil
	b.clearFences()
	return true
}

// Committed implements state.OwnBatches: a committed entry of another
// proposer (or an own batch given up on) set worker's holding of hashes,
// which from then on is the log's word, not a pending op's. Called with
// the engine lock held.
func (b *batcher) Committed(worker string, hashes []uint64) {
	if b.inflight == nil && len(b.window) == 0 {
		return
	}
	for _, h := range hashes {
		b.fence[fenceKey{worker, h}] = b.seq
	}
}

// Restored implements state.OwnBatches: the index was replaced by a
// snapshot, which pending ops no longer describe. Engine lock held.
func (b *batcher) Restored() {
	b.window, b.inflight = nil, nil
	b.clearFences()
}

func (b *batcher) clearFences() {
	if b.inflight == nil && len(b.window) == 0 {
		clear(b.fence)
	}
}

// Place queues a placement the engine just made; the engine lock must be
// held (it was made under it). hashes must not be modified afterwards.
func (b *batcher) Place(worker string, hashes []uint64, at time.Time) {
	b.add(true, worker, hashes, at)
}

// Unplace queues the withdrawal of a placement the engine just undid; the
// engine lock must be held. A placement still waiting in this window is
// dropped instead, so a queued withdrawal always refers to a placement
// replicated in an earlier window; flush can then replicate the withdrawals
// before the window's placements, and a prefix withdrawn and placed again
// within one window stays placed.
func (b *batcher) Unplace(worker string, hashes []uint64, at time.Time) {
	for i := len(b.window) - 1; i >= 0; i-- {
		if op := b.window[i]; op.place && op.worker == worker && slices.Equal(op.hashes, hashes) {
			b.window = slices.Delete(b.window, i, i+1)
			return
		}
	}
	b.add(false, worker, hashes, at)
}

// maxPendingOrigins bounds the origins waiting for a batch that commits.
func maxPendingOrigins(batchMax int) int { return 8 * batchMax }

// Origin queues a Responses API origin for replication; the engine lock
// must be held.
func (b *batcher) Origin(o *cartv1.ResponseOrigin) {
	b.origins = append(b.origins, o)
	if len(b.origins) >= b.max {
		select {
		case b.full <- struct{}{}:
		default:
		}
	}
}

func (b *batcher) add(place bool, worker string, hashes []uint64, at time.Time) {
	wid, _ := b.eng.WorkerIDOf(worker)
	b.seq++
	b.window = append(b.window, pendingOp{place: place, worker: worker, wid: wid, hashes: hashes, at: at.UnixNano(), seq: b.seq})
	if len(b.window) >= b.max {
		select {
		case b.full <- struct{}{}:
		default:
		}
	}
}

func (b *batcher) run(ctx context.Context) {
	t := time.NewTicker(b.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			b.flush(context.Background()) // best effort: hand the last window to Raft
			return
		case <-t.C:
		case <-b.full:
		}
		b.flush(ctx)
	}
}

// flush proposes the window as one entry and waits for its fate. Only the
// run loop (and tests) call it, never concurrently, so at most one batch
// is in flight.
func (b *batcher) flush(ctx context.Context) {
	b.lock.Lock()
	ops, origins := b.window, b.origins
	b.window, b.origins = nil, nil
	if len(ops) == 0 && len(origins) == 0 {
		b.lock.Unlock()
		return
	}
	b.batches++
	batch := &ownBatch{id: fmt.Sprintf("batch-%016x-%d", b.nonce, b.batches), ops: ops}
	b.inflight = batch
	// One entry per window: withdrawals (applied first) and placements.
	var place, unplace []*cartv1.Placement
	for _, op := range ops {
		p := &cartv1.Placement{Worker: op.worker, BlockHashes: op.hashes, AtUnixNanos: op.at}
		if op.place {
			place = append(place, p)
		} else {
			unplace = append(unplace, p)
		}
	}
	b.lock.Unlock()

	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cmd := &cartv1.RaftCommand{Ignorable: true, RequestId: batch.id, Body: &cartv1.RaftCommand_PlaceBatch{
		PlaceBatch: &cartv1.PlaceBatchCommand{Placements: place, Withdrawals: unplace, ResponseOrigins: origins}}}
	_, err := b.node.Apply(actx, cmd)

	b.lock.Lock()
	defer b.lock.Unlock()
	if b.inflight != batch {
		return // applied from the log (Own), whatever Apply said, or restored over
	}
	b.inflight = nil
	if err == nil {
		// Applied without passing through Own (a node that does not skip
		// own batches): committed all the same.
		b.clearFences()
		return
	}
	// Not committed as far as this node knows. The window behind it goes
	// too: its ops may build on the batch's (a withdrawal of one of its
	// placements) and, proposed alone, would leave the log out of step.
	window := b.window
	b.window = nil
	// Response origins are facts, not decisions: propose them again, but
	// keep at most maxPendingOrigins (the newest) while commits keep
	// failing; the leader's own table still pins the older ones.
	b.origins = append(origins, b.origins...)
	if n := len(b.origins) - maxPendingOrigins(b.max); n > 0 {
		b.origins = b.origins[n:]
	}
	undone := b.undo(window) + b.undo(ops)
	b.clearFences()
	b.log.Warn("placements not replicated; withdrawn from this node's index", "placements", len(place), "withdrawals", len(unplace),
		"queued_after", len(window), "blocks_undone", undone, "error", err.Error())
}

// discard undoes whatever is queued (after leadership is lost: it will
// never be proposed).
func (b *batcher) discard() {
	b.lock.Lock()
	defer b.lock.Unlock()
	window := b.window
	b.window, b.origins = nil, nil
	b.undo(window)
	b.clearFences()
}

// undo reverts ops in this node's index. It returns how many blocks it
// changed. Engine lock held.
func (b *batcher) undo(ops []pendingOp) int {
	n := 0
	b.inverse(ops, func(insert bool, worker string, wid uint32, hashes []uint64, at int64) {
		n += len(hashes)
		if insert {
			b.eng.Index().Insert(hashes, index.WorkerID(wid), at)
		} else {
			b.eng.Unplace(engine.Decision{Worker: worker, Placed: hashes})
		}
	})
	return n
}

// inverse calls fn with the changes that revert ops, in the reverse of log
// order (placements, then withdrawals, each newest first): insert=false
// removes worker as holder of hashes, insert=true restores it. Blocks a
// committed entry has set since, and workers removed since, are left out.
// Engine lock held.
func (b *batcher) inverse(ops []pendingOp, fn func(insert bool, worker string, wid uint32, hashes []uint64, at int64)) {
	for _, place := range []bool{true, false} {
		for i := len(ops) - 1; i >= 0; i-- {
			op := ops[i]
			if op.place != place {
				continue
			}
			if id, ok := b.eng.WorkerIDOf(op.worker); !ok || id != op.wid {
				continue // removed (and its entries with it) by a committed command
			}
			hs := make([]uint64, 0, len(op.hashes))
			for _, h := range op.hashes {
				if f, ok := b.fence[fenceKey{op.worker, h}]; !ok || f < op.seq {
					hs = append(hs, h)
				}
			}
			if len(hs) > 0 {
				fn(!place, op.worker, op.wid, hs, op.at)
			}
		}
	}
}

// Uncommitted implements state.OwnBatches: the changes that would take
// this node's index back to what the log says, as a failure would undo
// them (the window first, then the batch in flight). A snapshot applies
// them to its copy, so that it never persists a placement that may not
// commit. Engine lock held.
func (b *batcher) Uncommitted(fn func(insert bool, worker string, hashes []uint64, at int64)) {
	adapt := func(insert bool, worker string, _ uint32, hashes []uint64, at int64) { fn(insert, worker, hashes, at) }
	b.inverse(b.window, adapt)
	if b.inflight != nil {
		b.inverse(b.inflight.ops, adapt)
	}
}
