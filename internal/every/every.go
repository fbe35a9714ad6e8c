// Package every runs the periodic loops of the control and data planes
// (maintenance, lease sweeps, handover checks, batched proposals and
// flushes) so that each is one call and they all stop the same way: when
// their context ends, without a last run.
package every

import (
	"context"
	"time"
)

// Tick calls fn every interval until ctx ends, and also at once whenever
// kick receives (nil: never), for loops that a full buffer or a pending
// correction should not keep waiting for the next tick. fn runs on the
// caller's goroutine, so runs never overlap; a tick missed while fn runs
// is dropped, as time.Ticker drops it.
func Tick(ctx context.Context, interval time.Duration, kick <-chan struct{}, fn func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-kick:
		}
		fn()
	}
}
