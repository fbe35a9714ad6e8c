package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/cartrouter/cart/controlplane/discovery/dnstest"
	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/internal/testkit"
)

// srvRecords publishes replicas as SRV records of _w._tcp.pool (each with
// its own port, since they all listen on 127.0.0.1).
func srvRecords(rs ...*replica) []string {
	out := []string{"r.pool. 1 IN A 127.0.0.1"}
	for _, r := range rs {
		port := r.URL[strings.LastIndex(r.URL, ":")+1:]
		out = append(out, fmt.Sprintf("_w._tcp.pool. 1 IN SRV 0 0 %s r.pool.", port))
	}
	return out
}

func discoveryYAML(resolver string) string {
	return fmt.Sprintf(`
discovery:
  drain_timeout_secs: 30
  # The test's replicas listen on loopback, which discovery refuses unless
  # told otherwise.
  allowed_networks: [127.0.0.0/8]
  dns:
    name: _w._tcp.pool
    record_type: SRV
    resolver: %s
    min_interval_secs: 0.02
    max_interval_secs: 0.05
    remove_after: 2
    max_load: 50
`, resolver)
}

// postChat sends one chat request without touching t (it runs off the test
// goroutine) and reports the status and routed peer.
func postChat(base, body string) (int, string, error) {
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get(proxy.HeaderRoutedPeer), nil
}

// Replicas join and leave through DNS while traffic flows: no client sees
// an error, a replica that left DNS drains (no new requests; its in-flight
// request completes) before it is removed, a broken resolver keeps the
// last set, and a SIGHUP reload of the static list keeps discovered ones.
func TestDNSDiscoveryEndToEnd(t *testing.T) {
	x, y := newReplica(t, "x"), newReplica(t, "y")
	ra, rb, rc := newReplica(t, "a"), newReplica(t, "b"), newReplica(t, "c")
	ns := dnstest.Start(t)
	ns.Set(t, srvRecords(ra, rb)...)

	paths := configFiles(t, workersYAML(x.URL)+discoveryYAML(ns.Addr))
	a := newAllInOne(t, paths)
	base := runAllInOne(t, a)

	// A discovered replica takes requests once a probe round has read
	// its /v1/models (x, probed at start, is known to serve the model);
	// health rounds are the test's to drive here.
	probe := func() { a.Health.Round(context.Background()) }
	testkit.WaitFor(t, 10*time.Second, "a and b discovered", func() bool {
		ws := workers(t, base)
		return ws[ra.URL].Source == "dns" && ws[rb.URL].Source == "dns" && ws[x.URL].Source == "static"
	})
	probe()

	// b holds every request it gets until the test lets go.
	rb.mu.Lock()
	rb.hold = make(chan struct{})
	rb.mu.Unlock()
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(rb.hold) }) }
	t.Cleanup(release)

	var (
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		errs    atomic.Int64
		okByB   atomic.Int64
		sent    atomic.Int64
		firstEr atomic.Value
	)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				code, peer, err := postChat(base, chatBody(fmt.Sprintf("client %d request %d", g, i), "hi", false, 1))
				sent.Add(1)
				if err != nil || code != http.StatusOK {
					errs.Add(1)
					firstEr.CompareAndSwap(nil, fmt.Sprintf("code %d err %v", code, err))
					continue
				}
				if peer == rb.URL {
					okByB.Add(1)
				}
			}
		}()
	}
	stopTraffic := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}
	t.Cleanup(func() { release(); stopTraffic() })

	testkit.WaitFor(t, 10*time.Second, "a request in flight on b", func() bool { return rb.chats.Load() >= 1 })

	// c joins.
	ns.Set(t, srvRecords(ra, rb, rc)...)
	testkit.WaitFor(t, 10*time.Second, "traffic on c", func() bool { probe(); return rc.chats.Load() >= 3 })

	// b leaves DNS: it drains, keeping its held request.
	ns.Set(t, srvRecords(ra, rc)...)
	testkit.WaitFor(t, 10*time.Second, "b draining", func() bool { return workers(t, base)[rb.URL].Draining })
	for i := range 20 {
		code, peer, _ := chat(t, base, chatBody(fmt.Sprintf("after drain %d", i), "hi", false, 1))
		if code != http.StatusOK || peer == rb.URL {
			t.Fatalf("request %d while b drains: %d via %s", i, code, peer)
		}
	}
	if w := workers(t, base)[rb.URL]; w.URL == "" || w.Load == 0 {
		t.Fatalf("b should stay while its request is in flight: %+v", w)
	}
	release()
	testkit.WaitFor(t, 10*time.Second, "b removed once idle", func() bool { _, ok := workers(t, base)[rb.URL]; return !ok })
	testkit.WaitFor(t, 10*time.Second, "b's held request answered", func() bool { return okByB.Load() >= 1 })

	// A broken resolver keeps the last good set.
	ns.Fail(dns.RcodeServerFailure)
	testkit.WaitFor(t, 10*time.Second, "stale reported", func() bool {
		mfs := scrape(t, base)
		st, _ := sample(mfs, "cart_discovery_stale", map[string]string{"source": "dns"})
		n, _ := sample(mfs, "cart_discovery_errors_total", map[string]string{"source": "dns"})
		return st == 1 && n >= 5 // more failed answers than remove_after
	})
	// An empty answer too.
	ns.Set(t)
	before, _ := sample(scrape(t, base), "cart_discovery_errors_total", map[string]string{"source": "dns"})
	testkit.WaitFor(t, 10*time.Second, "empty answers counted", func() bool {
		n, _ := sample(scrape(t, base), "cart_discovery_errors_total", map[string]string{"source": "dns"})
		return n >= before+3
	})
	ws := workers(t, base)
	if ws[ra.URL].URL == "" || ws[rc.URL].URL == "" || ws[ra.URL].Draining || ws[rc.URL].Draining {
		t.Fatalf("the last good set was not kept: %+v", ws)
	}
	ns.Set(t, srvRecords(ra, rc)...)
	testkit.WaitFor(t, 10*time.Second, "fresh again", func() bool {
		st, _ := sample(scrape(t, base), "cart_discovery_stale", map[string]string{"source": "dns"})
		return st == 0
	})

	// SIGHUP: the static list changes, discovered workers stay.
	writeFile(t, paths[1], workersYAML(y.URL)+discoveryYAML(ns.Addr))
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	ws = workers(t, base)
	if _, ok := ws[x.URL]; ok || ws[y.URL].Source != "static" || ws[ra.URL].Source != "dns" || ws[rc.URL].Source != "dns" {
		t.Fatalf("after reload: %+v", ws)
	}

	stopTraffic()
	if n := errs.Load(); n != 0 {
		t.Fatalf("%d of %d client requests failed; first: %v", n, sent.Load(), firstEr.Load())
	}
}
