package server_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
)

// Reload accepts a changed workers list: kept workers keep their index
// entries (the same prefix still goes to them: the cache stays warm),
// removed workers' entries are dropped and they get no new requests, and a
// request in flight to a removed worker finishes normally.
func TestReloadWorkersKeepsWarmCacheAndDrainsRemoved(t *testing.T) {
	x, y, z := newReplica(t, "x"), newReplica(t, "y"), newReplica(t, "z")
	paths := configFiles(t, workersYAML(x.URL))
	a := newAllInOne(t, paths)
	base := serveHTTP(t, a)

	// A long shared prefix, routed while x is the only worker.
	prefix := longText("warm prefix", 3000)
	if code, peer, _ := chat(t, base, chatBody(prefix, "first", false, 1)); code != http.StatusOK || peer != x.URL {
		t.Fatalf("first request: %d via %s", code, peer)
	}

	// Reload 1: add z. x gets a load penalty, so a cache miss would now go
	// to z: only a warm index entry can keep the prefix on x.
	writeFile(t, paths[1], workersYAML(x.URL+";load_penalty: 5", z.URL))
	if err := a.Reload(); err != nil {
		t.Fatalf("reload 1: %v", err)
	}
	if code, peer, _ := chat(t, base, chatBody(prefix, "after reload 1", false, 1)); code != http.StatusOK || peer != x.URL {
		t.Fatalf("after adding z the cached prefix went to %s, want x %s", peer, x.URL)
	}

	// A request in flight on z when z is removed.
	z.mu.Lock()
	z.hold = make(chan struct{})
	z.mu.Unlock()
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(z.hold) }) }
	t.Cleanup(release) // before z closes, which waits for its handlers
	type result struct {
		code       int
		peer, body string
	}
	inflight := make(chan result, 1)
	other := longText("z's own prompt", 3000)
	go func() {
		code, peer, body := chat(t, base, chatBody(other, "slow", false, 1))
		inflight <- result{code, peer, body}
	}()
	testkit.WaitFor(t, 10*time.Second, "the request to reach z", func() bool { return z.chats.Load() == 1 })
	entriesBefore, _ := sample(scrape(t, base), "cart_index_entries", nil)

	// Reload 2: keep x, remove z, add y.
	writeFile(t, paths[1], workersYAML(x.URL+";load_penalty: 5", y.URL))
	if err := a.Reload(); err != nil {
		t.Fatalf("reload 2: %v", err)
	}
	mfs := scrape(t, base)
	entriesAfter, _ := sample(mfs, "cart_index_entries", nil)
	if entriesAfter >= entriesBefore {
		t.Fatalf("index entries %v -> %v: the removed worker's entries were not dropped", entriesBefore, entriesAfter)
	}
	ws := workers(t, base)
	if _, ok := ws[z.URL]; ok || len(ws) != 2 {
		t.Fatalf("/workers after removing z: %v", ws)
	}
	if _, ok := sample(mfs, "cart_worker_healthy", labels{"worker": z.URL}); ok {
		t.Fatal("cart_worker_healthy still reports the removed worker")
	}
	if _, ok := sample(mfs, "cart_circuit_breaker_state", labels{"worker": z.URL}); ok {
		t.Fatal("cart_circuit_breaker_state still reports the removed worker")
	}
	if v, ok := sample(mfs, "cart_worker_healthy", labels{"worker": y.URL}); !ok || v != 1 {
		t.Fatalf("cart_worker_healthy{added worker y} = %v (present %v), want 1", v, ok)
	}
	if v, ok := sample(mfs, "cart_circuit_breaker_state", labels{"worker": y.URL, "state": "closed"}); !ok || v != 1 {
		t.Fatalf("cart_circuit_breaker_state{y,closed} = %v (present %v), want 1", v, ok)
	}

	// The in-flight request on z finishes normally.
	release()
	res := <-inflight
	if res.code != http.StatusOK || res.peer != z.URL || !strings.Contains(res.body, "hi from z") {
		t.Fatalf("in-flight request on the removed worker: %d via %s: %s", res.code, res.peer, res.body)
	}

	// The cache stays warm for x; nothing new goes to z.
	hitsBefore, _ := sample(scrape(t, base), "cart_routing_decisions_total", labels{"reason": "cache_hit"})
	for i := range 5 {
		if code, peer, _ := chat(t, base, chatBody(prefix, fmt.Sprint("after reload 2 #", i), false, 1)); code != http.StatusOK || peer != x.URL {
			t.Fatalf("after reload 2 the cached prefix went to %s, want x", peer)
		}
	}
	for i := range 10 {
		if code, peer, _ := chat(t, base, chatBody(longText(fmt.Sprint("new", i), 500), "q", false, 1)); code != http.StatusOK || peer == z.URL {
			t.Fatalf("new request %d: %d via %s", i, code, peer)
		}
	}
	if n := z.chats.Load(); n != 1 {
		t.Fatalf("the removed worker got %d requests, want only the one in flight", n)
	}
	mfs = scrape(t, base)
	if hitsAfter, _ := sample(mfs, "cart_routing_decisions_total", labels{"reason": "cache_hit"}); hitsAfter < hitsBefore+5 {
		t.Fatalf("cache hits %v -> %v over 5 requests with the warm prefix", hitsBefore, hitsAfter)
	}
	if v, _ := sample(mfs, "cart_load_release_underflows_total", nil); v != 0 {
		t.Fatalf("load release underflows = %v after draining a removed worker", v)
	}
	if v, _ := sample(mfs, "cart_config_reloads_total", labels{"result": "accepted"}); v != 2 {
		t.Fatalf("accepted reloads = %v, want 2", v)
	}
	for _, w := range a.Router.Workers() {
		if w.Load != 0 {
			t.Fatalf("load left on %s: %d", w.URL, w.Load)
		}
	}
}

// Any change other than the workers list is rejected with an error naming
// the differing keys, and the running config stays (workers changes in the
// same file are not applied either).
func TestReloadRejectsOtherChanges(t *testing.T) {
	x, y := newReplica(t, "x"), newReplica(t, "y")
	paths := configFiles(t, workersYAML(x.URL))
	a := newAllInOne(t, paths)
	base := serveHTTP(t, a)

	writeFile(t, paths[1], workersYAML(x.URL, y.URL)+"cache:\n  threshold: 0.9\nserver:\n  port: 7000\n")
	err := a.Reload()
	if err == nil {
		t.Fatal("a reload changing cache.threshold and server.port was accepted")
	}
	for _, key := range []string{"cache.threshold", "server.port"} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("error does not name %s: %v", key, err)
		}
	}
	if _, keys, ok := strings.Cut(err.Error(), "differ:"); !ok || strings.Contains(keys, "workers") {
		t.Errorf("error should list the differing keys, without workers: %v", err)
	}
	if ws := workers(t, base); len(ws) != 1 {
		t.Fatalf("the rejected reload changed the workers: %v", ws)
	}
	for i := range 10 {
		if code, peer, _ := chat(t, base, chatBody(longText(fmt.Sprint("p", i), 300), "q", false, 1)); code != http.StatusOK || peer != x.URL {
			t.Fatalf("after the rejected reload: %d via %s", code, peer)
		}
	}

	// An invalid file is rejected too.
	writeFile(t, paths[1], workersYAML(x.URL)+"proxy:\n  max_retries: 99\n")
	if err := a.Reload(); err == nil || !strings.Contains(err.Error(), "proxy.max_retries") {
		t.Fatalf("invalid config: %v", err)
	}
	if v, _ := sample(scrape(t, base), "cart_config_reloads_total", labels{"result": "rejected"}); v != 2 {
		t.Fatalf("rejected reloads = %v, want 2", v)
	}

	// The running config was kept: a workers-only change still applies
	// against it (a stale cfg would make this fail on the old keys).
	writeFile(t, paths[1], workersYAML(x.URL, y.URL))
	if err := a.Reload(); err != nil {
		t.Fatalf("workers-only reload after rejected ones: %v", err)
	}
	if ws := workers(t, base); len(ws) != 2 {
		t.Fatalf("workers after the accepted reload: %v", ws)
	}
}

// A SIGHUP may arrive while the server is starting: Reload and Run must
// not race on the config (run with -race).
func TestReloadWhileStartingIsRaceFree(t *testing.T) {
	x, y := newReplica(t, "x"), newReplica(t, "y")
	paths := configFiles(t, workersYAML(x.URL))
	a := newAllInOne(t, paths)
	writeFile(t, paths[1], workersYAML(x.URL, y.URL))
	done := make(chan error, 1)
	go func() { done <- a.Reload() }()
	base := runAllInOne(t, a)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if ws := workers(t, base); len(ws) != 2 {
		t.Fatalf("workers after the reload: %v", ws)
	}
}
