package proxy_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cartrouter/cart/dataplane/breaker"
	"github.com/cartrouter/cart/dataplane/router"
	"github.com/cartrouter/cart/internal/testkit"
)

// countingRouter counts Route calls and keeps the requests' avoid lists.
type countingRouter struct {
	router.Router
	mu     sync.Mutex
	calls  int
	avoids [][]string
}

func (c *countingRouter) Decide(ctx context.Context, req *router.Request) (router.Decision, error) {
	c.mu.Lock()
	c.calls++
	c.avoids = append(c.avoids, slices.Clone(req.Avoid))
	c.mu.Unlock()
	return c.Router.Decide(ctx, req)
}

func (c *countingRouter) seen() (int, [][]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls, slices.Clone(c.avoids)
}

// Open breakers reach the router as its soft avoid list: a request routes
// around them in one Route call, and when every worker's breaker is open
// the trial request costs one Route call too (not a refused call and a
// second one), with the warning still logged.
func TestBreakerTrialIsOneRouteCall(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	var rt *countingRouter
	w := wrapped(func(inner router.Router) router.Router { rt = &countingRouter{Router: inner}; return rt })
	w.breaker = breaker.Config{Enabled: true, FailureThreshold: 1, SuccessThreshold: 1, Timeout: time.Hour}
	logs := &testkit.SyncBuffer{}
	r := newWiredRig(t, []string{a.URL, b.URL}, w, logsTo(logs))
	breaks := r.breaks
	post := func(user string) string {
		t.Helper()
		resp, err := http.Post(r.front.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("s", user, false)))
		if err != nil {
			t.Fatal(err)
		}
		body := readAll(t, resp)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", user, resp.StatusCode, body)
		}
		return body
	}
	const warning = "every usable worker has an open circuit breaker"

	breaks.Failure(a.URL, time.Now())
	if body := post("one open"); !strings.Contains(body, "hi from b") {
		t.Fatalf("with a's breaker open: %s, want b", body)
	}
	calls, avoids := rt.seen()
	if calls != 1 || !slices.Equal(avoids[0], []string{a.URL}) {
		t.Fatalf("one open breaker: %d Route calls with avoid lists %v, want 1 with [%s]", calls, avoids, a.URL)
	}
	if strings.Contains(logs.String(), warning) {
		t.Fatalf("warned of a trial that was not one: %s", logs)
	}

	breaks.Failure(b.URL, time.Now())
	post("all open")
	calls, avoids = rt.seen()
	if calls != 2 || len(avoids[1]) != 2 {
		t.Fatalf("every breaker open: %d Route calls in all with avoid lists %v, want 2 (one per request) avoiding both", calls, avoids)
	}
	if !strings.Contains(logs.String(), warning) {
		t.Fatalf("the trial was not logged: %s", logs)
	}
}
