package proxy_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/internal/testkit"
)

// heldBackend answers once release is closed, and says when a request
// entered it.
func heldBackend(t *testing.T, name string) (*backend, chan struct{}, chan string) {
	b := newBackend(t, name)
	release := make(chan struct{})
	entered := make(chan string, 16)
	b.set(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		entered <- string(body)
		select {
		case <-release:
		case <-r.Context().Done():
		}
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13}}`)
	})
	return b, release, entered
}

func maxLoadOne(_ *proxy.Options, _ *engine.Policy, s []engine.WorkerSpec) {
	for i := range s {
		s[i].MaxLoad = 1
	}
}

// A saturated pool does not answer 503: the request waits in CART and is
// sent when the worker has room, and no worker ever holds more than its
// limit.
func TestSaturatedPoolQueuesThenServes(t *testing.T) {
	a, release, entered := heldBackend(t, "a")
	r := newRig(t, []string{a.URL}, maxLoadOne)
	first := make(chan int, 1)
	go func() {
		resp := r.post("/v1/chat/completions", chatBody("s", "one", false))
		readAll(t, resp)
		first <- resp.StatusCode
	}()
	<-entered
	second := make(chan int, 1)
	go func() {
		resp := r.post("/v1/chat/completions", chatBody("s", "two", false))
		readAll(t, resp)
		second <- resp.StatusCode
	}()
	testkit.WaitFor(t, 5*time.Second, "the second request queued", func() bool { return len(r.router.Queue().Items) == 1 })
	select {
	case b := <-entered:
		t.Fatalf("a second request reached the worker at its limit: %s", b)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if s := <-first; s != http.StatusOK {
		t.Fatalf("first: %d", s)
	}
	if s := <-second; s != http.StatusOK {
		t.Fatalf("queued request: %d, want 200 once the worker had room", s)
	}
	if a.hits.Load() != 2 {
		t.Fatalf("worker saw %d requests", a.hits.Load())
	}
	r.waitLoadZero()
}

// A request still waiting at the queue timeout gets 429 with Retry-After,
// in the shape of the API it addressed.
func TestQueueTimeoutIs429InTheEndpointsShape(t *testing.T) {
	a, release, entered := heldBackend(t, "a")
	defer close(release)
	r := newFlowRig(t, []string{a.URL}, decider.FlowOptions{QueueTimeout: 100 * time.Millisecond, RetryAfter: 2 * time.Second}, maxLoadOne)
	go func() { readAll(t, r.post("/v1/chat/completions", chatBody("s", "held", false))) }()
	<-entered

	resp := r.post("/v1/chat/completions", chatBody("s", "waits", false))
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "2" {
		t.Fatalf("chat: %d Retry-After %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	assertOpenAIError(t, body, "queue timeout")
	var oe struct {
		Error struct{ Type, Code string } `json:"error"`
	}
	_ = json.Unmarshal([]byte(body), &oe)
	if oe.Error.Code != "queue_timeout" || oe.Error.Type != "rate_limit_error" {
		t.Fatalf("chat error %+v", oe.Error)
	}

	resp = r.post("/v1/messages", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"waits too"}]}`)
	body = readAll(t, resp)
	var ae struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &ae); err != nil || resp.StatusCode != http.StatusTooManyRequests ||
		ae.Type != "error" || ae.Error.Type != "rate_limit_error" || ae.Error.Message == "" {
		t.Fatalf("messages: %d %s", resp.StatusCode, body)
	}
	if a.hits.Load() != 1 {
		t.Fatalf("timed-out requests reached the worker: %d hits", a.hits.Load())
	}
}

// A client that disconnects while queued leaves the queue at once: no
// worker ever sees its request.
func TestClientLeavingTheQueue(t *testing.T) {
	a, release, entered := heldBackend(t, "a")
	r := newRig(t, []string{a.URL}, maxLoadOne)
	go func() { readAll(t, r.post("/v1/chat/completions", chatBody("s", "held", false))) }()
	<-entered
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.front.URL+"/v1/chat/completions", strings.NewReader(chatBody("s", "leaves", false)))
	req.Header.Set("Content-Type", "application/json")
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	testkit.WaitFor(t, 5*time.Second, "queued", func() bool { return len(r.router.Queue().Items) == 1 })
	cancel()
	<-errc
	testkit.WaitFor(t, 5*time.Second, "the queue empty after the client left", func() bool { return len(r.router.Queue().Items) == 0 })
	close(release)
	r.waitLoadZero()
	time.Sleep(20 * time.Millisecond)
	if a.hits.Load() != 1 {
		t.Fatalf("the worker saw %d requests; the one whose client left must not reach it", a.hits.Load())
	}
}

// Priority comes from the client key and, within the key's bound, from a
// header; a sheddable request is refused at once on a saturated pool and
// queued never.
func TestPriorityHeadersAndShedding(t *testing.T) {
	a, release, entered := heldBackend(t, "a")
	defer close(release)
	r := newRig(t, []string{a.URL}, func(o *proxy.Options, p *engine.Policy, s []engine.WorkerSpec) {
		maxLoadOne(o, p, s)
		o.Flow = proxy.FlowPolicy{PriorityHeaders: []string{"X-CART-Priority"}, DeadlineHeader: "X-CART-Deadline-Ms",
			Default: proxy.TenantFlow{Priority: 0, MaxPriority: 2, Weight: 1}}
	})
	go func() { readAll(t, r.post("/v1/chat/completions", chatBody("s", "held", false))) }()
	<-entered

	start := time.Now()
	resp := r.post("/v1/chat/completions", chatBody("s", "batch", false), "X-CART-Priority", "-1")
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, "request_shed") || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("sheddable on a saturated pool: %d %s", resp.StatusCode, body)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatal("a sheddable request waited")
	}
	for _, bad := range []string{"high", "1.5"} {
		resp = r.post("/v1/chat/completions", chatBody("s", "bad", false), "X-CART-Priority", bad)
		if body := readAll(t, resp); resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "invalid_priority") {
			t.Fatalf("priority %q: %d %s", bad, resp.StatusCode, body)
		}
	}
	resp = r.post("/v1/chat/completions", chatBody("s", "bad", false), "X-CART-Deadline-Ms", "-5")
	if body := readAll(t, resp); resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "invalid_deadline") {
		t.Fatalf("bad deadline: %d %s", resp.StatusCode, body)
	}
	// A priority above the key's max is clamped to it, not refused: the
	// request queues at priority 2.
	go func() {
		readAll(t, r.post("/v1/chat/completions", chatBody("s", "asks 99", false), "X-CART-Priority", "99"))
	}()
	testkit.WaitFor(t, 5*time.Second, "queued", func() bool { return len(r.router.Queue().Items) == 1 })
	if p := r.router.Queue().Items[0].Priority; p != 2 {
		t.Fatalf("priority 99 asked, the key allows 2: queued at %d", p)
	}
}

// With flow control on, a request pinned to a stored response's replica
// waits for that replica instead of a 503, and never moves.
func TestPinnedRequestWaitsForItsReplica(t *testing.T) {
	pool := newResponsesPool(t, 2)
	r := newRig(t, pool.urls(), maxLoadOne)
	id, owner := r.newResponse(t, "hello", "", false)
	var ob, other *backend
	for _, b := range pool.backends {
		if b.name == owner {
			ob = b
		} else {
			other = b
		}
	}
	entered, release := ob.holdThen(ob.handler, 4)
	otherBefore := other.hits.Load()
	go func() { readAll(t, r.post("/v1/responses", respBody("held", id, false))) }()
	<-entered
	done := make(chan int, 1)
	go func() {
		resp := r.post("/v1/responses", respBody("more", id, false))
		readAll(t, resp)
		done <- resp.StatusCode
	}()
	testkit.WaitFor(t, 5*time.Second, "the pinned request queued", func() bool { return len(r.router.Queue().Items) == 1 })
	close(release)
	if s := <-done; s != http.StatusOK {
		t.Fatalf("pinned request after its replica freed: %d", s)
	}
	if n := other.hits.Load() - otherBefore; n != 0 {
		t.Fatalf("%d pinned requests went to the other replica, which had room", n)
	}
	r.waitLoadZero()
}

// With engine priority on, the worker gets vLLM's priority field (lower
// first) as CART ranks the request, replacing the client's own, on the
// endpoints vLLM reads it on.
func TestEnginePriorityField(t *testing.T) {
	a, release, entered := heldBackend(t, "a")
	close(release)
	r := newRig(t, []string{a.URL}, func(o *proxy.Options, _ *engine.Policy, _ []engine.WorkerSpec) {
		o.Flow = proxy.FlowPolicy{PriorityHeaders: []string{"X-CART-Priority"}, EnginePriority: true,
			Default: proxy.TenantFlow{Priority: 0, MaxPriority: 10, Weight: 1}}
	})
	body := `{"model":"m","priority":-99,"messages":[{"role":"user","content":"hi"}]}`
	resp := r.post("/v1/chat/completions", body, "X-CART-Priority", "7")
	readAll(t, resp)
	got := <-entered
	var m map[string]any
	if err := json.Unmarshal([]byte(got), &m); err != nil {
		t.Fatalf("the worker got invalid JSON: %s", got)
	}
	if m["priority"] != float64(-7) || strings.Count(got, `"priority"`) != 1 {
		t.Fatalf("worker body %s: want exactly one priority, -7", got)
	}
	resp = r.post("/v1/messages", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`, "X-CART-Priority", "7")
	readAll(t, resp)
	if got := <-entered; strings.Contains(got, "priority") {
		t.Fatalf("/v1/messages body got a priority vLLM does not read there: %s", got)
	}
}
