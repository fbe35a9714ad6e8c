package service

import (
	"context"
	"time"
)

// MaintenanceOptions bound the prefix index on a control-plane node.
type MaintenanceOptions struct {
	Interval   time.Duration // eviction pass period; 0 relies on inline eviction
	MaxEntries int
}

// maintainChunk bounds how many entries one lock hold evicts, so Route
// never waits long behind a pass over a large index. Measured on a full
// 1M-entry index (BenchmarkEvictStep in controlplane/index, BenchmarkDecideUnderLoad in
// controlplane/state, CPU time on a busy 2-core box): 2048 entries held
// the lock up to 3.5 ms; with a snapshot being written (copy on write) 256
// entries still reached 0.7-1 ms at p99, hence 128.
const maintainChunk = 128

// RunMaintenance keeps this node's index within bounds until ctx ends:
// LRU eviction to MaxEntries in short locked steps, expiry of placements
// past the TTL and of idle sessions. Every node runs it (followers apply
// placements too), independently: what each evicts is a cache decision,
// not replicated state.
func (c *Core) RunMaintenance(ctx context.Context, o MaintenanceOptions) {
	if o.Interval <= 0 {
		o.Interval = time.Minute // TTL and session expiry still need a tick
	}
	t := time.NewTicker(o.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.maintainOnce(o.MaxEntries)
	}
}

func (c *Core) maintainOnce(maxEntries int) {
	now := c.o.Now().UnixNano()
	for done := false; !done; {
		c.mu.Lock()
		done = c.eng.MaintainStep(now, maxEntries, maintainChunk)
		c.mu.Unlock()
	}
}
