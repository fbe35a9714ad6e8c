package decider

import (
	"context"
	"time"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
	"github.com/cartrouter/cart/internal/every"
)

// maintainChunk bounds how many entries one lock hold evicts or expires,
// so Route never waits long behind a pass over a large index. Measured on
// a full 1M-entry index (BenchmarkEvictStep in controlplane/index,
// BenchmarkDecideUnderLoad in controlplane/state, CPU time on a busy 2-core
// box): 2048 entries held the lock up to 3.5 ms; with a snapshot being
// written (copy on write) 256 entries still reached 0.7-1 ms at p99, hence
// 128.
const maintainChunk = 128

// Run keeps the index within bounds until ctx ends: every interval (every
// minute when interval is 0, which relies on inline eviction for the size
// bound) one Maintain pass, and one at once whenever the index grows past
// half of its headroom, so that the headroom covers a pass's delay rather
// than a whole interval of new blocks. Both hosts run it, and on a control
// plane every node does, independently: followers apply placements too,
// and what each node evicts is a cache decision, not replicated state.
func (d *Decider) Run(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = time.Minute // TTL, session expiry and the daily reset still need a tick
	}
	every.Tick(ctx, interval, d.pressure, func() { d.Maintain() })
}

// PressurePasses counts the maintenance passes that found the index past
// half of its headroom.
func (d *Decider) PressurePasses() uint64 { return d.kicked.Load() }

// Maintain runs one pass: LRU eviction to MaxEntries, expiry of placements
// past the TTL and of idle sessions, each in short locked steps, then the
// daily reset if its hour has come. It returns the entries evicted.
func (d *Decider) Maintain() (evicted int) {
	d.maintaining.Store(true)
	defer func() {
		if d.pressure != nil {
			// A kick sent between the one this pass answers and the flag
			// saw the index before this pass evicted.
			select {
			case <-d.pressure:
			default:
			}
		}
		d.maintaining.Store(false)
	}()
	t := d.lock()
	before := d.eng.Index().Stats().Evicted
	if d.pressure != nil && d.eng.Index().Len() > d.highWater {
		d.kicked.Add(1)
	}
	now := d.o.Now()
	d.unlock(OpRead, t)
	d.Steps(OpMaintain, func(e *engine.Engine) bool {
		return e.MaintainStep(now.UnixNano(), d.o.MaxEntries, maintainChunk)
	})
	d.maybeDailyReset()
	t = d.lock()
	defer d.unlock(OpRead, t)
	return int(d.eng.Index().Stats().Evicted - before)
}

// maybeDailyReset clears the index once a day at the configured hour: a
// node that missed the hour (asleep, restarted) resets at its first pass
// after it.
func (d *Decider) maybeDailyReset() {
	if !d.o.DailyReset {
		return
	}
	t := d.lock()
	due := d.resetDue(d.o.Now().UTC())
	d.unlock(OpReset, t)
	if !due {
		return
	}
	// The next index's hash table, allocated before the lock: zeroing one sized
	// for a full index takes milliseconds.
	r := d.ReserveIndex(0)
	t = d.lock()
	defer d.unlock(OpReset, t)
	now := d.o.Now().UTC()
	if !d.resetDue(now) {
		return
	}
	// On a control plane this is each node's own cache decision, like
	// eviction: a leader's pending placements still replicate, and the
	// ledger may put back what a failed batch withdraws.
	d.eng.ClearIndex(r)
	d.lastReset = now
}

// ReserveIndex allocates the hash table for an index about to be refilled with
// n entries (a snapshot's restore; 0 for the daily reset), sized for the
// index's bound when it is presized (Options.PresizeIndex) and never
// beyond it (the index stores no more, however many records a snapshot
// holds); nil when there is nothing to reserve. Call it outside the
// critical section and hand the result to ClearIndex.
func (d *Decider) ReserveIndex(n int) *index.Reserved {
	if d.o.PresizeIndex {
		n = d.ceiling
	}
	n = min(n, d.ceiling)
	if n <= 0 {
		return nil
	}
	return index.Reserve(n)
}

// resetDue reports whether the daily reset's hour passed since the last
// one, at now. Inside the critical section.
func (d *Decider) resetDue(now time.Time) bool {
	due := time.Date(now.Year(), now.Month(), now.Day(), d.o.ResetHourUTC, 0, 0, 0, time.UTC)
	if now.Before(due) {
		due = due.AddDate(0, 0, -1)
	}
	return d.lastReset.Before(due)
}
