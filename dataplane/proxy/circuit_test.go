package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
)

// A replica answering 503 again and again opens its breaker; /workers and
// cart_circuit_breaker_state show it, and traffic then avoids it.
func TestBreakerOpensOnRepeatedFailuresAndTrafficAvoidsReplica(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	a.set(answer503("a"))
	r := newWiredRig(t, []string{a.URL, b.URL}, defaultWiring(), preferOrder(10)) // threshold 3
	for i := range 3 {
		resp := r.post("/v1/chat/completions", chatBody("s", fmt.Sprint("q", i), false))
		if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
		want := "closed"
		if i == 2 {
			want = "open"
		}
		if got := r.workerViews()[a.URL].BreakerState; got != want {
			t.Fatalf("after %d failures a's breaker is %q, want %q", i+1, got, want)
		}
	}
	if v := counterValue(t, r, "cart_circuit_breaker_state", `state="open",worker="`+a.URL+`"`); v != 1 {
		t.Fatalf("cart_circuit_breaker_state{open,a} = %v, want 1", v)
	}
	if v := counterValue(t, r, "cart_circuit_breaker_state", `state="closed",worker="`+a.URL+`"`); v != 0 {
		t.Fatalf("cart_circuit_breaker_state{closed,a} = %v, want 0", v)
	}
	if v := counterValue(t, r, "cart_circuit_breaker_transitions_total", `to="open",worker="`+a.URL+`"`); v != 1 {
		t.Fatalf("transitions to open = %v, want 1", v)
	}
	if got := r.workerViews()[b.URL].BreakerState; got != "closed" {
		t.Fatalf("b's breaker is %q", got)
	}
	for i := range 5 {
		resp := r.post("/v1/chat/completions", chatBody("s", fmt.Sprint("after ", i), false))
		if body := readAll(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(body, "hi from b") {
			t.Fatalf("status %d body %s", resp.StatusCode, body)
		}
	}
	if a.hits.Load() != 3 {
		t.Fatalf("a got %d attempts; after its breaker opened (3) it must get none", a.hits.Load())
	}
	if v := counterValue(t, r, "cart_retries_total", ""); v != 3 {
		t.Fatalf("cart_retries_total = %v, want 3 (none once a was avoided)", v)
	}
	r.waitLoadZero()
}

// After the breaker timeout the replica gets a trial (half-open); a
// success closes the breaker again.
func TestBreakerHalfOpenTrialClosesIt(t *testing.T) {
	a, _, r, clock := rigWithOpenBreaker(t)
	a.set(nil) // a recovers
	clock.advance(30 * time.Second)
	readAll(t, r.post("/v1/chat/completions", chatBody("s", "before timeout", false)))
	if a.hits.Load() != 3 {
		t.Fatalf("a got traffic while its breaker was open (hits %d)", a.hits.Load())
	}
	clock.advance(31 * time.Second) // past the 1 minute timeout
	resp := r.post("/v1/chat/completions", chatBody("s", "trial", false))
	if body := readAll(t, resp); !strings.Contains(body, "hi from a") {
		t.Fatalf("the trial request did not go to a: %s", body)
	}
	if got := r.workerViews()[a.URL].BreakerState; got != "closed" {
		t.Fatalf("a's breaker %q after a successful trial, want closed", got)
	}
	for _, to := range []string{"open", "half_open", "closed"} {
		if v := counterValue(t, r, "cart_circuit_breaker_transitions_total", `to="`+to+`",worker="`+a.URL+`"`); v != 1 {
			t.Fatalf("transitions of a to %s = %v, want 1", to, v)
		}
	}
	r.waitLoadZero()
}

// When every usable replica has an open breaker the proxy still sends a
// trial request rather than refusing everyone (proxy.decide): a pool that
// has recovered must not stay dark for the whole breaker timeout.
func TestAllBreakersOpenStillSendsTrial(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	a.set(answer503("a"))
	b.set(answer503("b"))
	r := newWiredRig(t, []string{a.URL, b.URL}, defaultWiring())
	for i := range 3 {
		resp := r.post("/v1/chat/completions", chatBody("s", fmt.Sprint("q", i), false))
		if body := readAll(t, resp); resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	for _, u := range []string{a.URL, b.URL} {
		if got := r.workerViews()[u].BreakerState; got != "open" {
			t.Fatalf("breaker of %s is %q, want open", u, got)
		}
	}
	a.set(nil)
	b.set(nil)
	before := a.hits.Load() + b.hits.Load()
	resp := r.post("/v1/chat/completions", chatBody("s", "after recovery", false))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(body, "hi from") {
		t.Fatalf("with every breaker open: %d %s, want a trial request served", resp.StatusCode, body)
	}
	if got := a.hits.Load() + b.hits.Load() - before; got != 1 {
		t.Fatalf("%d attempts for the trial request, want 1", got)
	}
	r.waitLoadZero()
}

// A client that hangs up is never counted as a breaker failure of the
// replica it was waiting for.
func TestClientDisconnectIsNotABreakerFailure(t *testing.T) {
	a := newBackend(t, "a")
	stop := stopChan(t)
	gone := make(chan time.Time, 1)
	a.set(hangUntilGone(stop, gone))
	r := newWiredRig(t, []string{a.URL}, defaultWiring()) // threshold 3
	for i := range 4 {
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			resp, err := r.postCtx(ctx, chatBody("s", fmt.Sprint("impatient ", i), false))
			if err == nil {
				resp.Body.Close()
			}
			errc <- err
		}()
		testkit.WaitFor(t, 5*time.Second, "a.hits.Load() == int64(i+1)", func() bool { return a.hits.Load() == int64(i+1) })
		cancel()
		if err := <-errc; err == nil {
			t.Fatal("the cancelled request succeeded")
		}
		select {
		case <-gone: // the proxy cancelled its upstream attempt
		case <-time.After(5 * time.Second):
			t.Fatal("the replica never saw the hang-up")
		}
		r.waitLoadZero()
	}
	testkit.WaitFor(t, 5*time.Second, "cart_client_disconnects_total == 4", func() bool { return counterValue(t, r, "cart_client_disconnects_total", "") == 4 })
	if got := r.breaks.State(a.URL).String(); got != "closed" {
		t.Fatalf("breaker %s after 4 client hang-ups (threshold 3)", got)
	}
	// Had the hang-ups counted, two real failures would now open it.
	a.set(answer503("a"))
	for range 2 {
		readAll(t, r.post("/v1/chat/completions", chatBody("s", "real failure", false)))
	}
	if got := r.breaks.State(a.URL).String(); got != "closed" {
		t.Fatalf("breaker %s after 4 hang-ups and 2 failures: the hang-ups were counted", got)
	}
	readAll(t, r.post("/v1/chat/completions", chatBody("s", "third failure", false)))
	if got := r.breaks.State(a.URL).String(); got != "open" {
		t.Fatalf("breaker %s after 3 real failures, want open", got)
	}
}
