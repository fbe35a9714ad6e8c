package proxy_test

import (
	"testing"
	"time"
)

// /workers must not keep showing a breaker open for a replica that
// recovered while no traffic flowed: once the timeout has passed, the next
// request would be a trial, and the view says so (half_open).
func TestWorkersViewBreakerAfterTimeoutWithoutTraffic(t *testing.T) {
	a, b, r, clock := rigWithOpenBreaker(t)
	a.set(nil)
	clock.advance(61 * time.Second) // past the 1 minute timeout, no request since
	if got := r.workerViews()[a.URL].BreakerState; got != "half_open" {
		t.Fatalf("a's breaker shows %q after its timeout with no traffic, want half_open", got)
	}
	if got := r.workerViews()[b.URL].BreakerState; got != "closed" {
		t.Fatalf("b's breaker %q, want closed", got)
	}
}
