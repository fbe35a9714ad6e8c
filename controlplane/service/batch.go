package service

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// batcher replicates the leader's placements in batches: one Raft entry
// every interval (or every max placements), instead of one per Route. A
// new leader's index lacks at most the last window, which only costs a few
// cache misses.
type batcher struct {
	node     Node
	interval time.Duration
	max      int
	log      *slog.Logger

	mu      sync.Mutex
	place   []*cartv1.Placement
	unplace []*cartv1.Placement
	full    chan struct{}

	// Batches this node proposed, by request id: when they come back
	// through the log, their placements are already in the engine.
	nonce uint64
	seq   atomic.Uint64
	own   sync.Map
}

// isOwn reports whether requestID is a batch this process proposed and
// forgets it (each entry is applied once per process lifetime).
func (b *batcher) isOwn(requestID string) bool {
	_, ok := b.own.LoadAndDelete(requestID)
	return ok
}

func newBatcher(n Node, interval time.Duration, maxN int, log *slog.Logger) *batcher {
	if interval <= 0 {
		interval = 10 * time.Millisecond
	}
	if maxN <= 0 {
		maxN = 512
	}
	return &batcher{node: n, interval: interval, max: maxN, log: log, full: make(chan struct{}, 1), nonce: rand.Uint64()}
}

func (b *batcher) add(list *[]*cartv1.Placement, worker string, hashes []uint64, at time.Time) {
	b.mu.Lock()
	*list = append(*list, &cartv1.Placement{Worker: worker, BlockHashes: hashes, AtUnixNanos: at.UnixNano()})
	n := len(b.place) + len(b.unplace)
	b.mu.Unlock()
	if n >= b.max {
		select {
		case b.full <- struct{}{}:
		default:
		}
	}
}

// Place queues a placement; hashes must not be modified afterwards.
func (b *batcher) Place(worker string, hashes []uint64, at time.Time) {
	b.add(&b.place, worker, hashes, at)
}

// Unplace queues the withdrawal of a placement. A placement still waiting
// in this window is dropped instead, so a queued withdrawal always refers to
// a placement replicated in an earlier window; flush can then replicate the
// withdrawals before the window's placements, and a prefix withdrawn and
// placed again within one window stays placed.
func (b *batcher) Unplace(worker string, hashes []uint64, at time.Time) {
	b.mu.Lock()
	for i := len(b.place) - 1; i >= 0; i-- {
		if p := b.place[i]; p.GetWorker() == worker && slices.Equal(p.GetBlockHashes(), hashes) {
			b.place = slices.Delete(b.place, i, i+1)
			b.mu.Unlock()
			return
		}
	}
	b.mu.Unlock()
	b.add(&b.unplace, worker, hashes, at)
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

func (b *batcher) flush(ctx context.Context) {
	b.mu.Lock()
	place, unplace := b.place, b.unplace
	b.place, b.unplace = nil, nil
	b.mu.Unlock()
	if len(place) == 0 && len(unplace) == 0 {
		return
	}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// One entry per window: withdrawals (applied first) and placements.
	id := fmt.Sprintf("batch-%016x-%d", b.nonce, b.seq.Add(1))
	b.own.Store(id, time.Now())
	cmd := &cartv1.RaftCommand{Ignorable: true, RequestId: id, Body: &cartv1.RaftCommand_PlaceBatch{
		PlaceBatch: &cartv1.PlaceBatchCommand{Placements: place, Withdrawals: unplace}}}
	if _, err := b.node.Apply(actx, cmd); err != nil {
		b.log.Warn("replicate placements", "placements", len(place), "withdrawals", len(unplace), "error", err.Error())
	}
	// The id stays registered even after an error: an entry of unknown
	// fate that commits later must still be skipped here (its placements
	// were made, and some perhaps withdrawn since, at decision time).
	// Applied entries remove themselves in isOwn; stale ids age out.
	b.own.Range(func(k, v any) bool {
		if time.Since(v.(time.Time)) > ownBatchTTL {
			b.own.Delete(k)
		}
		return true
	})
}

// ownBatchTTL bounds how long an unconfirmed batch id is remembered.
const ownBatchTTL = 10 * time.Minute

// discard drops whatever is queued (after leadership is lost).
func (b *batcher) discard() {
	b.mu.Lock()
	b.place, b.unplace = nil, nil
	b.mu.Unlock()
}
