package server_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
)

type healthBody struct {
	Status         string `json:"status"`
	HealthyWorkers int    `json:"healthy_workers"`
	Workers        int    `json:"workers"`
}

// Health checks through the assembled all-in-one server: failure_threshold
// consecutive failed probes take a worker out (one fewer does not), it
// gets no routed traffic while out, /health, /workers and
// cart_worker_healthy say so, and success_threshold good probes bring it
// back.
func TestUnhealthyWorkerGetsNoTrafficAndEndpointsShowIt(t *testing.T) {
	ra, rb := newReplica(t, "a"), newReplica(t, "b")
	a := newAllInOne(t, configFiles(t, workersYAML(ra.URL, rb.URL))) // failure 2, success 2
	base := serveHTTP(t, a)
	ctx := context.Background()
	expect := func(step string, wantHealthyB bool, wantCount, wantStatus int) {
		t.Helper()
		var h healthBody
		if code := getJSON(t, base+"/health", &h); code != wantStatus || h.HealthyWorkers != wantCount || h.Workers != 2 {
			t.Fatalf("%s: /health %d %+v, want %d with %d healthy of 2", step, code, h, wantStatus, wantCount)
		}
		if got := workers(t, base)[rb.URL].Healthy; got != wantHealthyB {
			t.Fatalf("%s: /workers says b healthy=%v, want %v", step, got, wantHealthyB)
		}
		want := 0.0
		if wantHealthyB {
			want = 1
		}
		if v, ok := sample(scrape(t, base), "cart_worker_healthy", labels{"worker": rb.URL}); !ok || v != want {
			t.Fatalf("%s: cart_worker_healthy{b} = %v (present %v), want %v", step, v, ok, want)
		}
	}

	expect("start", true, 2, http.StatusOK)
	rb.health.Store(http.StatusServiceUnavailable)
	a.Health.Round(ctx)
	expect("one failed probe of two", true, 2, http.StatusOK)
	a.Health.Round(ctx)
	expect("two failed probes", false, 1, http.StatusOK)

	for i := range 20 {
		code, peer, body := chat(t, base, chatBody(longText(fmt.Sprint("sys", i), 300), "q", false, 1))
		if code != http.StatusOK || peer != ra.URL {
			t.Fatalf("request %d: %d via %q (%s), want 200 via a", i, code, peer, body)
		}
	}
	if n := rb.chats.Load(); n != 0 {
		t.Fatalf("the unhealthy worker got %d requests", n)
	}

	rb.health.Store(http.StatusOK)
	a.Health.Round(ctx)
	expect("one good probe of two", false, 1, http.StatusOK)
	a.Health.Round(ctx)
	expect("two good probes", true, 2, http.StatusOK)
	n := 0
	testkit.WaitFor(t, 10*time.Second, "traffic to reach b again", func() bool {
		n++ // a new prompt each time: least loaded, ties broken at random
		chat(t, base, chatBody(longText(fmt.Sprint("again", n), 300), "q", false, 1))
		return rb.chats.Load() > 0
	})

	// With every worker out, /health is 503 and requests get a clear 503.
	ra.health.Store(http.StatusServiceUnavailable)
	rb.health.Store(http.StatusServiceUnavailable)
	a.Health.Round(ctx)
	a.Health.Round(ctx)
	var h healthBody
	if code := getJSON(t, base+"/health", &h); code != http.StatusServiceUnavailable || h.Status != "unavailable" {
		t.Fatalf("/health with no healthy worker: %d %+v", code, h)
	}
	if code, _, body := chat(t, base, chatBody("s", "q", false, 1)); code != http.StatusServiceUnavailable {
		t.Fatalf("request with no healthy worker: %d %s", code, body)
	}
}
