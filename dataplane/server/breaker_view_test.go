package server_test

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// A replica whose breaker opened and whose health check then went red and
// green again while no traffic flowed shows half_open in /workers (and gets
// trial requests), not an open breaker until its timeout.
func TestHealthRecoveryHalfOpensBreaker(t *testing.T) {
	ra, rb := newReplica(t, "a"), newReplica(t, "b")
	a := newAllInOne(t, configFiles(t, workersYAML(ra.URL, rb.URL))) // breaker threshold 3, health 2/2
	base := serveHTTP(t, a)
	ctx := context.Background()
	for range 3 {
		a.Break.Failure(rb.URL, time.Now()) // what failed requests to b report
	}
	if got := workers(t, base)[rb.URL].BreakerState; got != "open" {
		t.Fatalf("b's breaker %q, want open", got)
	}
	rb.health.Store(http.StatusServiceUnavailable)
	a.Health.Round(ctx)
	a.Health.Round(ctx)
	if got := workers(t, base)[rb.URL]; got.Healthy || got.BreakerState != "open" {
		t.Fatalf("b while its health check fails: %+v", got)
	}
	rb.health.Store(http.StatusOK)
	a.Health.Round(ctx)
	a.Health.Round(ctx)
	if got := workers(t, base)[rb.URL]; !got.Healthy || got.BreakerState != "half_open" {
		t.Fatalf("b after its health check turned green: healthy %v, breaker %q, want half_open", got.Healthy, got.BreakerState)
	}
}
