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

// Sleep waits for d or until ctx ends, whichever is first, and reports an
// ended ctx. A non-positive d does not wait but still reports an ended
// ctx, so that a zero backoff or time scale keeps honouring cancellation.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
