package remote

import (
	"slices"
	"sync"
	"time"
)

// maxLatencySamples bounds one sync window's Route latency samples; past
// it the oldest are overwritten, which keeps the percentile about the most
// recent calls.
const maxLatencySamples = 4096

// routeLatency collects the Route latency this data plane sees between two
// syncs, for the leader's slow-leader handover: a leader cannot measure
// how slow it looks from the data planes (its own decision time stays in
// microseconds while a slow link delays every answer).
type routeLatency struct {
	mu      sync.Mutex
	target  string
	samples []uint32 // microseconds
	next    int      // ring position once full
}

// add records one call to target that answered, or that got no answer
// within the route timeout (d is then the time waited). Calls to another
// node start the window over: the report is about one node.
func (l *routeLatency) add(target string, d time.Duration) {
	us := uint32(min(d.Microseconds(), int64(^uint32(0))))
	l.mu.Lock()
	defer l.mu.Unlock()
	if target != l.target {
		l.target, l.samples, l.next = target, l.samples[:0], 0
	}
	if len(l.samples) < maxLatencySamples {
		l.samples = append(l.samples, us)
		return
	}
	l.samples[l.next] = us
	l.next = (l.next + 1) % maxLatencySamples
}

// take returns the window's target, call count and 90th percentile in
// microseconds, and starts a new window.
func (l *routeLatency) take() (target string, calls, p90 uint32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	target, n := l.target, len(l.samples)
	if n == 0 {
		return target, 0, 0
	}
	slices.Sort(l.samples)
	p90 = l.samples[(n*9+9)/10-1] // nearest rank
	l.samples, l.next = l.samples[:0], 0
	return target, uint32(n), p90
}
