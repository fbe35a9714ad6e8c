package proxy_test

import (
	"fmt"
	"testing"
	"time"
)

// /workers must not keep showing a breaker open for a replica that
// recovered while no traffic flowed: once the timeout has passed, the next
// request would be a trial, and the view says so (half_open).
func TestWorkersViewBreakerAfterTimeoutWithoutTraffic(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	a.set(answer503("a"))
	var clock fakeClock
	w := defaultWiring()
	w.now = clock.now
	r := newWiredRig(t, []string{a.URL, b.URL}, w, preferOrder(10))
	for i := range 3 {
		readAll(t, r.post("/v1/chat/completions", chatBody("s", fmt.Sprint("q", i), false)))
	}
	if got := r.workerViews()[a.URL].BreakerState; got != "open" {
		t.Fatalf("a's breaker %q, want open", got)
	}
	a.set(nil)
	clock.advance(61 * time.Second) // past the 1 minute timeout, no request since
	if got := r.workerViews()[a.URL].BreakerState; got != "half_open" {
		t.Fatalf("a's breaker shows %q after its timeout with no traffic, want half_open", got)
	}
	if got := r.workerViews()[b.URL].BreakerState; got != "closed" {
		t.Fatalf("b's breaker %q, want closed", got)
	}
}
