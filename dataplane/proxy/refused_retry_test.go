package proxy_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cartrouter/cart/dataplane/breaker"
	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/internal/testkit"
)

// killable is a replica on a fixed loopback address that can be killed
// (listener closed: new connections are refused) and started again.
type killable struct {
	t    *testing.T
	addr string
	h    http.Handler
	mu   sync.Mutex
	srv  *http.Server
	done chan struct{}
}

func newKillable(t *testing.T, name string, delay time.Duration) *killable {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		time.Sleep(delay)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi from %s"}}]}`, name)
	})
	k := &killable{t: t, addr: ln.Addr().String(), h: h}
	k.serve(ln, h)
	t.Cleanup(k.kill)
	return k
}

func (k *killable) serve(ln net.Listener, h http.Handler) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	// One connection per request: a kill then refuses every new attempt
	// and never races an idle keep-alive connection being reused (a
	// request written to a connection the replica then drops may have
	// been processed, so it rightly stays under the budget).
	srv.SetKeepAlivesEnabled(false)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	k.mu.Lock()
	k.srv, k.done = srv, done
	k.mu.Unlock()
}

// kill closes the listener and idle connections; requests already being
// served finish (they are not what this test is about).
func (k *killable) kill() {
	k.mu.Lock()
	srv, done := k.srv, k.done
	k.srv = nil
	k.mu.Unlock()
	if srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx)
	<-done
}

func (k *killable) restart() {
	var ln net.Listener
	var err error
	// The port was ours a moment ago; binding it again can briefly fail
	// while the kernel tears the old socket down.
	for deadline := time.Now().Add(2 * time.Second); ; {
		if ln, err = net.Listen("tcp", k.addr); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err != nil {
		k.t.Errorf("restart %s: %v", k.addr, err)
		return
	}
	k.serve(ln, k.h)
}

// One of three replicas is killed again and again (its listener closed)
// under concurrent load, with a retry budget far smaller than the number
// of requests that hit the dead replica at once. A refused connection
// never reached a replica, so it is retried on another outside the budget:
// no client sees a 502 while two healthy replicas remain. (Before, the
// refused attempts competed for the budget's single token and lost.)
func TestRefusedConnectionsRetriedOutsideBudget(t *testing.T) {
	const (
		clients = 8
		kills   = 6
		down    = 120 * time.Millisecond
		up      = 60 * time.Millisecond
	)
	var reps []*killable
	var urls []string
	for i := range 3 {
		k := newKillable(t, fmt.Sprint("r", i), 3*time.Millisecond)
		reps = append(reps, k)
		urls = append(urls, "http://"+k.addr)
	}
	w := defaultWiring()
	// A short breaker timeout sends traffic back to the restarted replica
	// quickly, so every kill catches requests on their way to it.
	w.breaker = breaker.Config{Enabled: true, FailureThreshold: 3, SuccessThreshold: 1, Timeout: 20 * time.Millisecond}
	failures := testkit.NewLogRecorder()
	r := newWiredRig(t, urls, w, withOptions(func(o *proxy.Options) {
		o.Logger = slog.New(failures)
		// A connection the kernel accepted into the listen backlog just
		// before the kill is reset after the request was written. That
		// attempt may have been processed as far as the proxy can tell,
		// so it is retried under the budget; on a loaded machine several
		// can pile up at one kill instant and exhaust it. Those are told
		// apart below by the error that ended the request.
		o.RetryBudgetMin = 2
		o.RetryBudgetRatio = 0
		o.MaxRetries = 2
	}))
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	defer client.Transport.(*http.Transport).CloseIdleConnections()

	stop := make(chan struct{})
	var mu sync.Mutex
	statuses := map[int]int{}
	var bodies []string
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				body := chatBody(longText(fmt.Sprintf("client %d request %d", c, n), 200), "hi", false)
				req, _ := http.NewRequest(http.MethodPost, r.front.URL+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					t.Errorf("client %d: %v", c, err)
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				mu.Lock()
				statuses[resp.StatusCode]++
				if resp.StatusCode != http.StatusOK && len(bodies) < 5 {
					bodies = append(bodies, string(b))
				}
				mu.Unlock()
			}
		}()
	}
	for i := range kills {
		time.Sleep(up)
		reps[i%len(reps)].kill()
		time.Sleep(down)
		reps[i%len(reps)].restart()
	}
	close(stop)
	wg.Wait()

	notSent := counterValue(t, r, "cart_retries_total", "not_sent")
	exhausted := counterValue(t, r, "cart_retry_budget_exhausted_total", "")
	t.Logf("%d kills of one of 3 replicas under %d clients: statuses %v, retries of unsent attempts %v, retry budget exhausted %v",
		kills, clients, statuses, notSent, exhausted)
	if notSent == 0 {
		t.Fatal("no attempt was refused: the kills did not catch any request")
	}
	// The proxy logs a failure after writing its answer, so the last 502s
	// may reach the clients before their log lines exist.
	testkit.Poll(5*time.Second, func() (bool, string) {
		return len(failures.Values("request failed", "error")) >= statuses[http.StatusBadGateway], ""
	})
	refused, written := classify(failures)
	if len(refused) > 0 {
		t.Fatalf("%d requests failed on a refused connection while two replicas were up (statuses %v): %q", len(refused), statuses, refused)
	}
	for s, n := range statuses {
		if s != http.StatusOK && s != http.StatusBadGateway {
			t.Fatalf("%d × status %d (statuses %v); e.g. %q", n, s, statuses, bodies)
		}
	}
	if n := statuses[http.StatusBadGateway]; n != len(written) {
		t.Fatalf("%d × 502 but %d failures logged after the request was written (%q): a 502 had another cause; e.g. %q", n, len(written), written, bodies)
	}
	if len(written) > 0 {
		t.Logf("%d requests lost a connection the kernel had queued before the kill (written, so under the budget): %q", len(written), written)
	}
	r.waitLoadZero()
	assertNoDoubleRelease(t, r)
}

// classify splits final failures into refused connections (never sent:
// must not happen while replicas remain) and connections lost after the
// request was written (reset or EOF from a backlog connection).
func classify(failures *testkit.LogRecorder) (refused, written []string) {
	for _, e := range failures.Values("request failed", "error") {
		switch {
		case strings.Contains(e, "connection refused"):
			refused = append(refused, e)
		case strings.Contains(e, "EOF") || strings.Contains(e, "connection reset"):
			written = append(written, e)
		default:
			refused = append(refused, e) // unexpected: count it as a failure of the test
		}
	}
	return refused, written
}

func TestNeverSentIsNotACatchAll(t *testing.T) {
	// A request that reached a worker and lost its connection mid-answer
	// may have been processed: it stays under the budget.
	b := newBackend(t, "a")
	b.set(func(w http.ResponseWriter, r *http.Request) {
		hj, ok := w.(http.Hijacker)
		if !ok {
			t.Error("no hijacker")
			return
		}
		conn, _, _ := hj.Hijack()
		_ = conn.Close()
	})
	c := newBackend(t, "c")
	r := newRig(t, []string{b.URL, c.URL}, preferOrder(100), withOptions(func(o *proxy.Options) {
		o.RetryBudgetMin = 1
	}))
	resp := r.post("/v1/chat/completions", chatBody("s", "u", false))
	if got := readAll(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(got, "hi from c") {
		t.Fatalf("status %d body %q", resp.StatusCode, got)
	}
	if v := counterValue(t, r, "cart_retries_total", "not_sent"); v != 0 {
		t.Fatalf("a connection lost after the request was written counted as never sent (%v)", v)
	}
	if v := counterValue(t, r, "cart_retries_total", "upstream_failure"); v != 1 {
		t.Fatalf("upstream_failure retries = %v, want 1", v)
	}
}
