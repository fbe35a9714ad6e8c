package every

import (
	"sync/atomic"
	"time"
)

// Gate lets one caller through at most once per period, without a lock:
// for log lines that every request could otherwise repeat (a rejected
// token, an oversized answer). The zero value lets the first call through.
type Gate struct{ last atomic.Int64 }

// Allow reports whether a call at now may pass, given the period; the
// passing call starts the next period. Of concurrent callers in a new
// period exactly one passes.
func (g *Gate) Allow(now time.Time, period time.Duration) bool {
	n := now.UnixNano()
	last := g.last.Load()
	if last != 0 && n-last < int64(period) {
		return false
	}
	return g.last.CompareAndSwap(last, n)
}
