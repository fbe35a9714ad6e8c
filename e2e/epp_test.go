package e2e

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/cartrouter/cart/dataplane/epp/epptest"
	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/internal/testkit/proc"
)

// eppNode is a `cart epp` asking the control plane: its metrics listener
// as an httpNode (for cart_fallback_total), its ext_proc address apart.
type eppNode struct {
	*httpNode
	grpcAddr string
	conn     *grpc.ClientConn
}

// numEPPs endpoint pickers share the control plane.
const numEPPs = 3

// startEPPs starts the endpoint pickers once, for the steps that use them.
func (e *env) startEPPs(t *testing.T) {
	t.Helper()
	if e.epps != nil {
		return
	}
	for i := 1; i <= numEPPs; i++ {
		n := &eppNode{httpNode: &httpNode{id: fmt.Sprintf("epp%d", i), addr: testkit.FreeAddr(t)}, grpcAddr: testkit.FreeAddr(t)}
		_, port, _ := net.SplitHostPort(n.grpcAddr)
		cfg := filepath.Join(e.dir, n.id+".yaml")
		writeFile(t, cfg, fmt.Sprintf(`server: {host: 127.0.0.1, port: %s, min_open_files: 0, shutdown_grace_secs: 1, metrics_addr: %q}
log: {level: warn, format: text}
dataplane:
  id: %s
  control_plane: [%s]
  route_timeout_ms: %d
  worker_sync_interval_ms: %d
`, port, n.addr, n.id, strings.Join(e.cpURLs(), ", "), routeTimeoutMs, syncIntervalMs))
		// Started under the whole test (TestCluster's t): the steps that
		// use the pickers share them.
		n.Proc = proc.Start(e.t, proc.Cmd{Name: n.id, Path: e.cartBin, Args: []string{"epp", "-c", cfg}})
		conn, err := epptest.Dial(n.grpcAddr, nil)
		if err != nil {
			t.Fatal(err)
		}
		e.t.Cleanup(func() { _ = conn.Close() })
		n.conn = conn
		e.epps = append(e.epps, n)
	}
	for _, n := range e.epps {
		n.WaitFor(t, 20*time.Second, "readiness", func() (bool, string) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			return epptest.Ready(ctx, n.conn)
		})
	}
}

func (e *env) eppHTTPNodes() []*httpNode {
	out := make([]*httpNode, len(e.epps))
	for i, n := range e.epps {
		out[i] = n.httpNode
	}
	return out
}

// eppGateway serves an Envoy-like gateway whose streams go round robin to
// the first n pickers, and counts what it sees.
type eppGateway struct {
	base string
	mu   sync.Mutex
	seen int
	errs []string // ImmediateResponses and gateway-side failures
}

func (e *env) eppGateway(t *testing.T, n int) *eppGateway {
	t.Helper()
	g := &eppGateway{}
	var conns []*grpc.ClientConn
	for _, p := range e.epps[:n] {
		conns = append(conns, p.conn)
	}
	ts := httptest.NewServer(&epptest.Gateway{Conns: conns, Observe: func(ex epptest.Exchange) {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.seen++
		switch {
		case ex.Immediate != 0:
			g.errs = append(g.errs, fmt.Sprintf("ImmediateResponse %d", ex.Immediate))
		case ex.Err != nil:
			g.errs = append(g.errs, ex.Err.Error())
		}
	}})
	t.Cleanup(ts.Close)
	g.base = ts.URL
	return g
}

func (g *eppGateway) check(t *testing.T, what string) {
	t.Helper()
	// An exchange is observed once the gateway's handler returns, just
	// after its client has the answer: wait until the count stops moving.
	count := func() int { g.mu.Lock(); defer g.mu.Unlock(); return g.seen }
	for last, deadline := -1, time.Now().Add(5*time.Second); time.Now().Before(deadline); time.Sleep(300 * time.Millisecond) {
		n := count()
		if n == last {
			break
		}
		last = n
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	t.Logf("%s: %d exchanges through the gateway, %d ImmediateResponses or failures", what, g.seen, len(g.errs))
	for i, e := range g.errs {
		if i < 5 {
			t.Errorf("%s: %s", what, e)
		}
	}
}

// 5. The endpoint pickers route as the data planes do: the prefix
// workload through a gateway over one picker has the hit ratio of one data
// plane, and three pickers sharing the control plane keep it (within 2
// points, as for data planes): the shared index, not the picker replica,
// decides. No request gets an ImmediateResponse.
func testEPPHitRatio(t *testing.T, e *env) {
	e.setWorkers(t, urlsOf(e.fast))
	e.startEPPs(t)
	h := map[string]float64{}
	for _, run := range []struct {
		name string
		base func() string
		g    *eppGateway
	}{
		{"1 data plane", func() string { return e.fe["dp1"] }, nil},
		{"1 endpoint picker", nil, e.eppGateway(t, 1)},
		{"3 endpoint pickers", nil, e.eppGateway(t, numEPPs)},
	} {
		for _, r := range e.fast {
			r.s.Reset()
		}
		base := ""
		if run.g != nil {
			base = run.g.base
		} else {
			base = run.base()
		}
		start := time.Now()
		ratio, rs := prefixWorkload(t, base, "hr-"+strings.ReplaceAll(run.name, " ", "-"))
		h[run.name] = ratio
		t.Logf("%-20s hit ratio %.4f (%d requests, %v)", run.name, ratio, len(rs), time.Since(start).Round(time.Millisecond))
		if run.g != nil {
			run.g.check(t, run.name)
		}
	}
	dp, one, three := h["1 data plane"], h["1 endpoint picker"], h["3 endpoint pickers"]
	if math.Abs(one-dp) > 0.02 {
		t.Errorf("1 endpoint picker: hit ratio %.4f vs %.4f through a data plane, want within 0.02", one, dp)
	}
	if math.Abs(three-one) > 0.02 {
		t.Errorf("3 endpoint pickers: hit ratio %.4f vs %.4f with one, want within 0.02", three, one)
	}
}

// 6. SIGKILL of the Raft leader under load through a gateway over the
// three pickers: every request answered 200, no ImmediateResponse, and the
// hit ratio after failover within 5 points of before.
func testEPPLeaderKill(t *testing.T, e *env) {
	e.setWorkers(t, urlsOf(e.fast))
	e.startEPPs(t)
	g := e.eppGateway(t, numEPPs)
	leaderKill(t, e, "epp-failover", g.base, e.eppHTTPNodes(), len(e.liveDPs())+len(e.epps))
	g.check(t, "leader kill")
}
