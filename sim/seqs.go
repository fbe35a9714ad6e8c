package sim

import (
	"context"
	"slices"
	"sync"
	"time"
)

// sequences models an engine's running batch: at most max requests run at
// once (vLLM --max-num-seqs), from admission to their last token; the rest
// wait in the engine's own queue, first come first served, or by the
// request's "priority" field (lower first, then arrival) under the priority
// policy, as vLLM's --scheduling-policy priority orders its waiting queue.
// max 0 runs everything at once, as the simulator did before it had a
// batch limit.
type sequences struct {
	mu       sync.Mutex
	max      int
	priority bool
	running  int
	waiting  []*seqWaiter // in the order they will run
	n        uint64
	// waited, when set, is told each admitted request's time in the
	// waiting queue (0 for one that found a free slot): the figure that
	// shows whether a router in front kept the engine's queue empty.
	waited func(time.Duration)
}

type seqWaiter struct {
	prio  int
	n     uint64
	ready chan struct{}
}

func (q *sequences) before(a, b *seqWaiter) bool {
	if q.priority && a.prio != b.prio {
		return a.prio < b.prio
	}
	return a.n < b.n
}

// acquire waits for a running slot; on ctx's end it gives up its place.
func (q *sequences) acquire(ctx context.Context, prio int) error {
	q.mu.Lock()
	if q.max <= 0 || q.running < q.max && len(q.waiting) == 0 {
		q.running++
		q.mu.Unlock()
		q.observe(0)
		return nil
	}
	start := time.Now()
	q.n++
	w := &seqWaiter{prio: prio, n: q.n, ready: make(chan struct{})}
	i, _ := slices.BinarySearchFunc(q.waiting, w, func(x, y *seqWaiter) int {
		if q.before(x, y) {
			return -1
		}
		return 1
	})
	q.waiting = slices.Insert(q.waiting, i, w)
	q.mu.Unlock()
	select {
	case <-w.ready:
		q.observe(time.Since(start))
		return nil
	case <-ctx.Done():
		q.mu.Lock()
		defer q.mu.Unlock()
		if j := slices.Index(q.waiting, w); j >= 0 {
			q.waiting = slices.Delete(q.waiting, j, j+1)
			return ctx.Err()
		}
		// Granted meanwhile: hand the slot on.
		q.releaseLocked()
		return ctx.Err()
	}
}

func (q *sequences) observe(d time.Duration) {
	if q.waited != nil {
		q.waited(d)
	}
}

func (q *sequences) release() {
	if q.max <= 0 {
		q.mu.Lock()
		q.running--
		q.mu.Unlock()
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.releaseLocked()
}

func (q *sequences) releaseLocked() {
	if len(q.waiting) > 0 && q.running <= q.max {
		w := q.waiting[0]
		q.waiting = q.waiting[1:]
		close(w.ready) // the slot passes to w: running stays
		return
	}
	q.running--
}

// counts reports the requests running and waiting.
func (q *sequences) counts() (running, waiting int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.running, len(q.waiting)
}
