package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/dataplane/router"
)

// ledgerRouter wraps a router and counts the Done calls each decision gets:
// the proxy owes exactly one per decision Route handed out. It tags each
// decision through its ticket's ID (the proxy hands tickets back
// untouched) and restores the inner router's ID before passing Done on.
type ledgerRouter struct {
	router.Router
	mu     sync.Mutex
	next   int
	dones  map[int]int
	inner  map[int]uint64 // the inner router's ticket ID per decision
	double []string       // decisions settled more than once
}

// ledgerBase keeps the ledger's tags apart from any ID a router issues.
const ledgerBase = 1 << 48

func newLedger(r router.Router) *ledgerRouter {
	return &ledgerRouter{Router: r, dones: map[int]int{}, inner: map[int]uint64{}}
}

func (l *ledgerRouter) Decide(ctx context.Context, req *router.Request) (router.Decision, error) {
	d, err := l.Router.Decide(ctx, req)
	if err != nil || req.DryRun {
		return d, err
	}
	l.mu.Lock()
	l.next++
	id := l.next
	l.dones[id] = 0
	l.inner[id] = d.Ticket.ID
	l.mu.Unlock()
	d.Ticket.ID = ledgerBase + uint64(id)
	return d, nil
}

func (l *ledgerRouter) Done(d router.Decision, o router.Outcome) {
	id := int(d.Ticket.ID - ledgerBase)
	l.mu.Lock()
	inner, ok := l.inner[id]
	if d.Ticket.ID < ledgerBase || !ok {
		l.mu.Unlock()
		panic("Done got a decision this router never handed out")
	}
	l.dones[id]++
	first := l.dones[id] == 1
	if !first {
		l.double = append(l.double, fmt.Sprintf("decision %d for %s settled %d times (last %+v)", id, d.Worker, l.dones[id], o))
	}
	l.mu.Unlock()
	d.Ticket.ID = inner
	if first {
		l.Router.Done(d, o)
	}
}

// check fails the test on a decision settled twice, and on one still
// unsettled when the deadline passes (bodies are closed asynchronously
// after the client has its answer).
func (l *ledgerRouter) check(t *testing.T, wantDecisions int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		l.mu.Lock()
		var open []int
		for id, n := range l.dones {
			if n == 0 {
				open = append(open, id)
			}
		}
		double, routed := append([]string(nil), l.double...), l.next
		l.mu.Unlock()
		if len(double) > 0 {
			t.Fatalf("settled more than once: %v", double)
		}
		if len(open) == 0 {
			if routed < wantDecisions {
				t.Fatalf("%d decisions, want at least %d: the scenario did not run as meant", routed, wantDecisions)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("decisions %v never settled", open)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Every decision the proxy gets is settled exactly once, on each way an
// attempt can end: delivered, rejected then retried, rejected and
// delivered as the last answer, refused connection, client gone mid-stream,
// stalled stream.
func TestEveryDecisionSettledOnce(t *testing.T) {
	ok := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, `{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":0}}}`)
	}
	busy := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	release := make(chan struct{})
	streamForever := oneEventThenWait(release)
	defer close(release)
	cases := []struct {
		name      string
		handlers  []http.HandlerFunc // nil entry: a worker that refuses connections
		idle      time.Duration
		abort     bool // the client hangs up after the first chunk
		decisions int
	}{
		{name: "delivered", handlers: []http.HandlerFunc{ok}, decisions: 1},
		{name: "rejected then retried", handlers: []http.HandlerFunc{busy, ok}, decisions: 1},
		{name: "rejected everywhere, last answer delivered", handlers: []http.HandlerFunc{busy, busy}, decisions: 2},
		{name: "refused connection then retried", handlers: []http.HandlerFunc{nil, ok}, decisions: 1},
		{name: "client gone mid-stream", handlers: []http.HandlerFunc{streamForever}, abort: true, decisions: 1},
		{name: "stalled stream", handlers: []http.HandlerFunc{streamForever}, idle: 50 * time.Millisecond, decisions: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var urls []string
			for i, h := range tc.handlers {
				if h == nil {
					urls = append(urls, closedURL(t))
					continue
				}
				b := newBackend(t, fmt.Sprint("w", i))
				b.set(h)
				urls = append(urls, b.URL)
			}
			var ledger *ledgerRouter
			r := newWiredRig(t, urls, wrapped(func(inner router.Router) router.Router { ledger = newLedger(inner); return ledger }),
				withOptions(func(o *proxy.Options) { o.StreamIdleTimeout = tc.idle }))
			// Each request a new prompt, so that the routes spread over the
			// workers and the retried cases reach their second worker.
			for i := range 4 {
				ctx, cancel := context.WithCancel(context.Background())
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.front.URL+"/v1/chat/completions",
					strings.NewReader(chatBody(fmt.Sprint("system ", tc.name, i), "hello", tc.abort || tc.idle > 0)))
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					cancel()
					t.Fatal(err)
				}
				if tc.abort {
					buf := make([]byte, 8)
					_, _ = io.ReadAtLeast(resp.Body, buf, 1)
					cancel()
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				cancel()
			}
			ledger.check(t, tc.decisions)
		})
	}
}
