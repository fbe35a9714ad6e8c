package service

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/every"
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

	// The ledger changes together with the index it describes, so undoing
	// a batch and applying a committed entry never interleave: everything
	// below changes only inside dec's critical section (Do, or the
	// decider calling Place/Unplace, or the state calling OwnBatches).
	dec *decider.Decider

	window   []pendingOp              // decided, not yet proposed
	origins  []*cartv1.ResponseOrigin // learned, not yet proposed (never undone)
	inflight *ownBatch                // proposed, fate not known yet (one at a time)
	batches  uint64
	seq      uint64 // numbers pending ops, for fences
	// fence holds, for (worker, hash) pairs a committed entry of another
	// proposer touched while ops were pending, the last op seq at that
	// moment: ops up to it are superseded by the log and never undone.
	// A decision made while an undo is under way fences its pairs the same
	// way against the ops still to be undone.
	fence    map[fenceKey]uint64
	fenceTop uint64 // the highest seq in fence

	// undoQ holds the ops of a batch that failed to commit (and of the
	// window behind it) still to be reverted, in revert order. They are
	// reverted a chunk per lock hold (undoChunk blocks), so that a window
	// stretched by a stalled proposal (up to 5 s of decisions) does not
	// stop routing while it is undone; decisions made in between fence
	// what they set (see fence). undoTop is the highest seq in undoQ;
	// undoLow the lowest queued since undoQ was last empty (a bound, not
	// kept exact as the queue drains: clearFences needs no pass over it).
	undoQ   []pendingOp
	undoTop uint64
	undoLow uint64

	// Touches (recency refreshes of blocks a worker already held) ride in
	// the batches too, but they are hints, not ledger ops: the leader's
	// index already has them, so they are never undone, and one lost with
	// its window only leaves followers' recency as it was.
	touches []touchOp          // this window's, one per key
	touchAt map[touchKey]int   // index in touches by key
	touchBl int                // blocks in touches
	recent  map[touchKey]int64 // keys queued in the current generation, with when
	older   map[touchKey]int64 // the generation before
	genAt   int64              // when recent started
	touchN  [numTouchOutcomes]atomic.Uint64

	// Proposed entries, and the records and block hashes in them by kind
	// (what a batch costs the log, on every node).
	proposed atomic.Uint64
	records  [numBatchKinds]atomic.Uint64
	blocks   [numBatchKinds]atomic.Uint64
}

// Kinds of records in a batch, for cart_cp_batch_records_total and
// cart_cp_batch_blocks_total.
const (
	kindPlacement = iota
	kindWithdrawal
	kindTouch
	numBatchKinds
)

var batchKindNames = [numBatchKinds]string{"placement", "withdrawal", "touch"}

// touchInterval is how often at most one (worker, deepest block) touch is
// replicated. Recency finer than that orders nothing that matters: a
// block is evicted after the whole capacity of newer blocks went by,
// which at these cache sizes and route rates takes far longer than a
// second; and a hot prefix (a system prompt, a conversation's head),
// matched on most routes, would otherwise cost a path of hashes in
// every window.
const touchInterval = time.Second

// maxTouchKeys bounds each of the two generations of the table of recent
// touches (so at most 2*maxTouchKeys entries, about 5 MB with map
// overhead): 13 times the keys of a second at 5,000 hits/s, the highest
// rate this control plane sustains. Past it the table turns over early
// and some touches are replicated again within touchInterval: more bytes,
// never a wrong index.
const maxTouchKeys = 1 << 16

// maxTouchBlocksPerWindow bounds the block hashes a window's touches carry.
// A touch carries the whole matched path, and in a multi-turn chat each
// turn's deepest match is new (the previous turn's end), so neither the
// per-window merge nor touchInterval holds it back: unbounded, a long
// conversation's touches would grow the log with the square of its
// length. 4,096 blocks (32 KiB) per window is 80k blocks/s at the default
// 50 ms windows, over ten times what the fixed-prefix bench needs
// (5.5-6.2k/s); touches past it are dropped, as hints may be.
const maxTouchBlocksPerWindow = 4096

// touchKey names a touch by the chosen worker's engine id (a worker
// removed and added again is another) and the deepest block it matched:
// block hashes chain their prefix, so the deepest names the whole path.
type touchKey struct {
	wid  uint32
	hash uint64
}

type touchOp struct {
	worker string
	hashes []uint64
	at     int64
}

// Touch outcomes, for cart_cp_touches_total.
const (
	touchQueued     = iota // queued for replication
	touchMerged            // its key was already in the window: time updated
	touchLimited           // replicated less than touchInterval ago: dropped
	touchOverBudget        // the window's touches already carry maxTouchBlocksPerWindow blocks: dropped
	numTouchOutcomes
)

var touchOutcomeNames = [numTouchOutcomes]string{"queued", "merged", "limited", "over_budget"}

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

func newBatcher(n Node, interval time.Duration, maxN int, log *slog.Logger, dec *decider.Decider) *batcher {
	if interval <= 0 {
		interval = 10 * time.Millisecond
	}
	if maxN <= 0 {
		maxN = 512
	}
	return &batcher{node: n, interval: interval, max: maxN, log: log, full: make(chan struct{}, 1), nonce: rand.Uint64(),
		dec: dec, fence: map[fenceKey]uint64{}, touchAt: map[touchKey]int{}, recent: map[touchKey]int64{}}
}

// Own implements state.OwnBatches: requestID is the batch in flight, whose
// changes are already in the index. It is committed now, so its ops leave
// the ledger. Inside the decider's critical section.
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
// which from then on is the log's word, not a pending op's. Inside the
// decider's critical section.
func (b *batcher) Committed(worker string, hashes []uint64) {
	if b.inflight == nil && len(b.window) == 0 && len(b.undoQ) == 0 {
		return
	}
	for _, h := range hashes {
		b.fence[fenceKey{worker, h}] = b.seq
	}
	b.fenceTop = b.seq
}

// Restored implements state.OwnBatches: the index was replaced by a
// snapshot, which pending ops no longer describe. Inside the decider's
// critical section.
func (b *batcher) Restored() {
	b.window, b.inflight, b.undoQ = nil, nil, nil
	b.dropTouches()
	b.clearFences()
}

// clearFences forgets the fences once no pending op is old enough for
// them to supersede (op seqs only grow), so that the table does not grow
// with the fences of long-settled ops while the window is never empty.
func (b *batcher) clearFences() {
	oldest := uint64(math.MaxUint64)
	if b.inflight != nil && len(b.inflight.ops) > 0 {
		oldest = b.inflight.ops[0].seq
	}
	if len(b.window) > 0 {
		oldest = min(oldest, b.window[0].seq)
	}
	if len(b.undoQ) > 0 {
		oldest = min(oldest, b.undoLow)
	}
	if oldest > b.fenceTop {
		clear(b.fence)
	}
}

// Place implements decider.Ledger: it queues a placement the engine just
// made. hashes must not be modified afterwards.
func (b *batcher) Place(eng *engine.Engine, worker string, hashes []uint64, at time.Time) {
	b.add(eng, true, worker, hashes, at)
}

// Unplace implements decider.Ledger: it queues the withdrawal of a
// placement the engine just undid. A placement still waiting in this window is
// dropped instead, so a queued withdrawal always refers to a placement
// replicated in an earlier window; flush can then replicate the withdrawals
// before the window's placements, and a prefix withdrawn and placed again
// within one window stays placed.
func (b *batcher) Unplace(eng *engine.Engine, worker string, hashes []uint64, at time.Time) {
	for i := len(b.window) - 1; i >= 0; i-- {
		if op := b.window[i]; op.place && op.worker == worker && slices.Equal(op.hashes, hashes) {
			b.window = slices.Delete(b.window, i, i+1)
			return
		}
	}
	b.add(eng, false, worker, hashes, at)
}

// Touch implements decider.Ledger: it queues a recency refresh of blocks
// worker already held, unless one for the same worker and deepest block
// is in this window (its time moves forward) or was queued less than
// touchInterval ago. hashes are copied only if queued. Inside the
// decider's critical section.
func (b *batcher) Touch(eng *engine.Engine, worker string, hashes []uint64, at time.Time) {
	wid, ok := eng.WorkerIDOf(worker)
	if !ok || len(hashes) == 0 {
		return
	}
	k, now := touchKey{wid, hashes[len(hashes)-1]}, at.UnixNano()
	if i, ok := b.touchAt[k]; ok {
		b.touches[i].at = max(b.touches[i].at, now)
		b.touchN[touchMerged].Add(1)
		return
	}
	if last, ok := b.lastTouch(k); ok && now >= last && now-last < int64(touchInterval) {
		b.touchN[touchLimited].Add(1)
		return
	}
	if b.touchBl+len(hashes) > maxTouchBlocksPerWindow {
		b.touchN[touchOverBudget].Add(1)
		return
	}
	b.touchBl += len(hashes)
	b.rememberTouch(k, now)
	b.touchAt[k] = len(b.touches)
	b.touches = append(b.touches, touchOp{worker: worker, hashes: slices.Clone(hashes), at: now})
	b.touchN[touchQueued].Add(1)
	b.signalIfFull()
}

func (b *batcher) lastTouch(k touchKey) (int64, bool) {
	if t, ok := b.recent[k]; ok {
		return t, true
	}
	t, ok := b.older[k]
	return t, ok
}

// rememberTouch records k in the current generation, starting a new one
// (and forgetting the one before) every touchInterval or maxTouchKeys
// keys: a key two generations old is past the interval, or the table
// overflowed and the touch is merely sent again early. A fresh map rather
// than clear: clearing a full one would hold the routing lock for as long
// as it takes to zero it.
func (b *batcher) rememberTouch(k touchKey, now int64) {
	if len(b.recent) >= maxTouchKeys || now-b.genAt >= int64(touchInterval) || now < b.genAt {
		b.older, b.recent, b.genAt = b.recent, make(map[touchKey]int64), now
	}
	b.recent[k] = now
}

// dropTouches forgets the window's touches. Inside the decider's critical
// section.
func (b *batcher) dropTouches() {
	b.touches, b.touchBl = nil, 0
	if len(b.touchAt) > 1024 {
		// clear costs the map's capacity, which never shrinks: one window
		// stretched by a stalled proposal must not tax every later one.
		b.touchAt = make(map[touchKey]int)
		return
	}
	clear(b.touchAt)
}

// Touches counts touches by outcome ("queued", "merged", "limited",
// "over_budget").
func (b *batcher) Touches(outcome int) uint64 { return b.touchN[outcome].Load() }

// maxPendingOrigins bounds the origins waiting for a batch that commits.
func maxPendingOrigins(batchMax int) int { return 8 * batchMax }

// Origins queues Responses API origins for replication.
func (b *batcher) Origins(os []*cartv1.ResponseOrigin) {
	b.dec.Do(decider.OpLedger, func(*engine.Engine) {
		b.origins = append(b.origins, os...)
		if len(b.origins) >= b.max {
			select {
			case b.full <- struct{}{}:
			default:
			}
		}
	})
}

func (b *batcher) add(eng *engine.Engine, place bool, worker string, hashes []uint64, at time.Time) {
	wid, _ := eng.WorkerIDOf(worker)
	if len(b.undoQ) > 0 {
		// What this decision sets is newer than every op still to be
		// undone: the undo must leave it. Fenced at undoTop, not at this
		// op's seq, so that a later failure still undoes this op itself.
		for _, h := range hashes {
			k := fenceKey{worker, h}
			b.fence[k] = max(b.fence[k], b.undoTop)
		}
		b.fenceTop = max(b.fenceTop, b.undoTop)
	}
	b.seq++
	b.window = append(b.window, pendingOp{place: place, worker: worker, wid: wid, hashes: hashes, at: at.UnixNano(), seq: b.seq})
	b.signalIfFull()
}

// signalIfFull asks for an early flush when the window holds max ops
// (touches count: they are bytes of the entry too).
func (b *batcher) signalIfFull() {
	if len(b.window)+len(b.touches) >= b.max {
		select {
		case b.full <- struct{}{}:
		default:
		}
	}
}

func (b *batcher) run(ctx context.Context) {
	every.Tick(ctx, b.interval, b.full, func() { b.flush(ctx) })
	b.flush(context.Background()) // best effort: hand the last window to Raft
}

// flush proposes the window as one entry and waits for its fate. Only the
// run loop (and tests) call it, never concurrently, so at most one batch
// is in flight.
func (b *batcher) flush(ctx context.Context) {
	var batch *ownBatch
	var origins []*cartv1.ResponseOrigin
	var touchOps []touchOp
	b.dec.Do(decider.OpLedger, func(eng *engine.Engine) { batch, origins, touchOps = b.take(eng) })
	if batch == nil {
		return
	}
	var touches []*cartv1.Placement
	if len(touchOps) > 0 {
		touches = make([]*cartv1.Placement, len(touchOps))
		for i, t := range touchOps {
			touches[i] = &cartv1.Placement{Worker: t.worker, BlockHashes: t.hashes, AtUnixNanos: t.at}
		}
	}
	ops := batch.ops
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

	b.proposed.Add(1)
	for kind, ps := range [numBatchKinds][]*cartv1.Placement{place, unplace, touches} {
		n := 0
		for _, p := range ps {
			n += len(p.BlockHashes)
		}
		b.records[kind].Add(uint64(len(ps)))
		b.blocks[kind].Add(uint64(n))
	}

	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cmd := &cartv1.RaftCommand{Ignorable: true, RequestId: batch.id, Body: &cartv1.RaftCommand_PlaceBatch{
		PlaceBatch: &cartv1.PlaceBatchCommand{Placements: place, Withdrawals: unplace, ResponseOrigins: origins, Touches: touches}}}
	_, err := b.node.Apply(actx, cmd)
	b.dec.Do(decider.OpLedger, func(eng *engine.Engine) { b.settle(eng, batch, origins, len(place), len(unplace), err) })
	if err != nil {
		n := b.drainUndo()
		b.log.Info("uncommitted placements withdrawn", "blocks", n)
	}
}

// take moves the window into a new batch in flight (nil when there is
// nothing to propose). The touches go with it but not into the ledger:
// nothing undoes them. Inside the decider's critical section.
func (b *batcher) take(eng *engine.Engine) (*ownBatch, []*cartv1.ResponseOrigin, []touchOp) {
	ops, origins, touches := b.window, b.origins, b.touches
	b.window, b.origins = nil, nil
	// A worker whose index id changed since an op was queued (its engine
	// reported its cache cleared, committed at once by the KV applier; or
	// it was removed and added again) no longer holds what the op placed
	// on this node: replicated, the op would give every follower the
	// holdings the clear took from the leader.
	ops = slices.DeleteFunc(ops, func(op pendingOp) bool {
		id, ok := eng.WorkerIDOf(op.worker)
		return !ok || id != op.wid
	})
	b.dropTouches()
	if len(ops) == 0 && len(origins) == 0 && len(touches) == 0 {
		return nil, nil, nil
	}
	b.batches++
	batch := &ownBatch{id: fmt.Sprintf("batch-%016x-%d", b.nonce, b.batches), ops: ops}
	b.inflight = batch
	return batch, origins, touches
}

// settle records the fate of the batch in flight: committed, or undone
// together with the window behind it. Inside the decider's critical
// section.
func (b *batcher) settle(eng *engine.Engine, batch *ownBatch, origins []*cartv1.ResponseOrigin, places, unplaces int, err error) {
	ops := batch.ops
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
	// The window's touches may refresh blocks its undone placements put
	// there: replicated, they would hand followers holdings this node no
	// longer has.
	b.dropTouches()
	// Response origins are facts, not decisions: propose them again, but
	// keep at most maxPendingOrigins (the newest) while commits keep
	// failing; the leader's own table still pins the older ones.
	b.origins = append(origins, b.origins...)
	if n := len(b.origins) - maxPendingOrigins(b.max); n > 0 {
		b.origins = b.origins[n:]
	}
	b.queueUndo(window, ops)
	b.log.Warn("placements not replicated; withdrawing them from this node's index", "placements", places, "withdrawals", unplaces,
		"queued_after", len(window), "error", err.Error())
}

// discard undoes whatever is queued (after leadership is lost: it will
// never be proposed).
func (b *batcher) discard() {
	b.dec.Do(decider.OpLedger, func(eng *engine.Engine) {
		window := b.window
		b.window, b.origins = nil, nil
		b.dropTouches()
		b.queueUndo(window)
	})
	b.drainUndo()
}

// undoChunk is the least blocks one lock hold of an undo reverts (an op
// is never split, so a hold may revert one op more): 0.1-0.3 ms of CPU
// per hold (BenchmarkFailedBatchUndoStall).
const undoChunk = 512

// queueUndo appends the reverts of each list of ops (newest list first)
// to the undo queue. Inside the decider's critical section.
func (b *batcher) queueUndo(lists ...[]pendingOp) {
	if len(b.undoQ) == 0 {
		b.undoLow = math.MaxUint64
	}
	for _, ops := range lists {
		b.undoQ = appendRevertOrder(b.undoQ, ops)
		for _, op := range ops {
			b.undoTop = max(b.undoTop, op.seq)
			b.undoLow = min(b.undoLow, op.seq)
		}
	}
	b.clearFences()
}

// drainUndo reverts the undo queue a chunk per lock hold, yielding to
// decisions in between. It returns how many blocks it changed.
func (b *batcher) drainUndo() int {
	n := 0
	b.dec.Steps(decider.OpLedger, func(eng *engine.Engine) bool {
		done, more := b.undoStep(eng, undoChunk)
		n += done
		return !more
	})
	return n
}

// undoStep reverts ops from the front of the undo queue until it has
// reverted at least budget blocks or the queue is empty, and reports the
// blocks and whether ops are left. Inside the decider's critical section.
func (b *batcher) undoStep(eng *engine.Engine, budget int) (done int, more bool) {
	for len(b.undoQ) > 0 && done < budget {
		op := b.undoQ[0]
		b.undoQ = b.undoQ[1:]
		b.revert(eng, op, func(insert bool, worker string, wid uint32, hashes []uint64, at int64) {
			if insert {
				eng.Index().Insert(hashes, index.WorkerID(wid), at)
			} else {
				eng.Unplace(engine.Decision{Worker: worker, Placed: hashes})
			}
		})
		done += len(op.hashes)
	}
	if len(b.undoQ) > 0 {
		return done, true
	}
	b.undoQ = nil // let the drained backing array go
	b.clearFences()
	return done, false
}

// appendRevertOrder appends ops in the order that reverts them: the
// reverse of log order (placements, then withdrawals, each newest first).
func appendRevertOrder(dst, ops []pendingOp) []pendingOp {
	for _, place := range []bool{true, false} {
		for i := len(ops) - 1; i >= 0; i-- {
			if ops[i].place == place {
				dst = append(dst, ops[i])
			}
		}
	}
	return dst
}

// revert calls fn with the change that reverts op: insert=false removes
// worker as holder of hashes, insert=true restores it. Blocks a committed
// entry (or a decision made during an undo) has set since, and workers
// removed since, are left out. Inside the decider's critical section.
func (b *batcher) revert(eng *engine.Engine, op pendingOp, fn func(insert bool, worker string, wid uint32, hashes []uint64, at int64)) {
	if id, ok := eng.WorkerIDOf(op.worker); !ok || id != op.wid {
		return // removed (and its entries with it) by a committed command
	}
	if hs := b.unfenced(op); len(hs) > 0 {
		fn(!op.place, op.worker, op.wid, hs, op.at)
	}
}

// unfenced returns op's blocks no fence keeps from being reverted: op's
// own slice (never modified) when none is fenced, the usual case, so that
// an undo allocates only for the ops a fence cuts into.
func (b *batcher) unfenced(op pendingOp) []uint64 {
	if len(b.fence) == 0 {
		return op.hashes
	}
	var hs []uint64 // a copy, started at the first fenced block
	for i, h := range op.hashes {
		f, ok := b.fence[fenceKey{op.worker, h}]
		fenced := ok && f >= op.seq
		switch {
		case fenced && hs == nil:
			hs = append(make([]uint64, 0, len(op.hashes)-1), op.hashes[:i]...)
		case !fenced && hs != nil:
			hs = append(hs, h)
		}
	}
	if hs == nil {
		return op.hashes
	}
	return hs
}

// Uncommitted implements state.OwnBatches: the changes that would take
// this node's index back to what the log says, as a failure would undo
// them (the window first, then the batch in flight). A snapshot applies
// them to its copy, so that it never persists a placement that may not
// commit. Inside the decider's critical section.
func (b *batcher) Uncommitted(eng *engine.Engine, fn func(insert bool, worker string, hashes []uint64, at int64)) {
	adapt := func(insert bool, worker string, _ uint32, hashes []uint64, at int64) { fn(insert, worker, hashes, at) }
	order := appendRevertOrder(nil, b.window)
	if b.inflight != nil {
		order = appendRevertOrder(order, b.inflight.ops)
	}
	// An undo under way: what it has not reverted yet, older than both.
	for _, op := range append(order, b.undoQ...) {
		b.revert(eng, op, adapt)
	}
}
