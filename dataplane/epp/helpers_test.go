package epp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/dataplane/epp"
	"github.com/cartrouter/cart/dataplane/epp/epptest"
	"github.com/cartrouter/cart/dataplane/server"
	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/sim"
	"github.com/cartrouter/cart/sim/simtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, append(testkit.IdleHTTPConns(), testkit.IgnoreZMQPubWriter)...)
}

// picker is an all-in-one endpoint picker (server.NewEPP, as cart epp
// builds it) on a loopback port, in front of cart-sim replicas.
type picker struct {
	EPP     *server.EPP
	Addr    string
	Metrics string // base URL of its /metrics listener
	Conn    *grpc.ClientConn
	Sims    []*simtest.Replica
}

// startPicker runs a picker over n replicas; mutate edits the config.
func startPicker(t *testing.T, n int, mutate func(*config.Config)) *picker {
	t.Helper()
	cfg := config.Default()
	var sims []*simtest.Replica
	for i := range n {
		r := simtest.Start(t, sim.Config{Name: fmt.Sprint("sim-", i), BlockTokens: 16, OutputTokens: 8, Models: []string{"sim"}})
		sims = append(sims, r)
		// Declared, so that the model filter knows them from the start.
		cfg.Workers = append(cfg.Workers, config.Worker{URL: r.URL, Models: []string{"sim"}})
	}
	cfg.Server.Host, cfg.Server.MinOpenFiles, cfg.Server.ShutdownGraceSecs = "127.0.0.1", 0, 1
	cfg.Server.MetricsAddr = fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	cfg.Health.IntervalSecs, cfg.Health.TimeoutSecs = 3600, 1
	cfg.Log.Level = "error"
	if mutate != nil {
		mutate(cfg)
	}
	if err := cfg.Validate(config.RoleEPP); err != nil {
		t.Fatal(err)
	}
	e, err := server.NewEPP(cfg, nil, slog.New(slog.NewTextHandler(io.Discard, nil)), 7, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := testkit.RunOnLoopback(t, e.Run)
	conn, err := epptest.Dial(addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Closed before the picker stops (cleanups run last-in first-out).
	t.Cleanup(func() { _ = conn.Close() })
	return &picker{EPP: e, Addr: addr, Metrics: "http://" + cfg.Server.MetricsAddr, Conn: conn, Sims: sims}
}

// gateway serves g (its Conn set to the picker's) on a loopback port.
func (p *picker) gateway(t *testing.T, g *epptest.Gateway) string {
	t.Helper()
	if g == nil {
		g = &epptest.Gateway{}
	}
	g.Conn = p.Conn
	ts := httptest.NewServer(g)
	t.Cleanup(ts.Close)
	return ts.URL
}

// endpoint is replica i's address as the picker names it.
func (p *picker) endpoint(t *testing.T, i int) string {
	t.Helper()
	a, ok := epp.Endpoint(p.Sims[i].URL)
	if !ok {
		t.Fatalf("replica %s has no endpoint", p.Sims[i].URL)
	}
	return a
}

// load is the router's in-flight count on replica i.
func (p *picker) load(i int) int { return p.EPP.AllInOne.Router.Load(p.Sims[i].URL) }

// metric reads one series from the picker's /metrics (0 when absent).
func (p *picker) metric(t *testing.T, series string) float64 {
	t.Helper()
	v, _, err := testkit.MetricSample(http.DefaultClient, p.Metrics+"/metrics", series)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// waitIdle waits until no replica holds load in the router.
func (p *picker) waitIdle(t *testing.T) {
	t.Helper()
	testkit.WaitForMsg(t, 10*time.Second, "every replica's load released", func() (bool, string) {
		var loads []int
		idle := true
		for i := range p.Sims {
			loads = append(loads, p.load(i))
			idle = idle && loads[i] == 0
		}
		return idle, fmt.Sprint("loads ", loads)
	})
}

// open starts a raw stream.
func (p *picker) open(t *testing.T) *epptest.Stream {
	t.Helper()
	s, err := epptest.Open(context.Background(), p.Conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Reset)
	return s
}

func send(t *testing.T, s *epptest.Stream, msgs ...*extprocv3.ProcessingRequest) {
	t.Helper()
	for _, m := range msgs {
		err := s.Send(m)
		if errors.Is(err, io.EOF) {
			// The picker may answer (an ImmediateResponse) and end the
			// stream before the rest is sent, as a gateway sees it too;
			// the answer is there for Recv.
			return
		}
		if err != nil {
			t.Fatalf("send %T: %v", m.GetRequest(), err)
		}
	}
}

func recv(t *testing.T, s *epptest.Stream) *extprocv3.ProcessingResponse {
	t.Helper()
	m, err := s.Recv()
	if err != nil {
		t.Fatalf("recv: %v", err)
	}
	return m
}

func chatBody(system, question string) []byte {
	return []byte(fmt.Sprintf(`{"model":"sim","max_tokens":4,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, system, question))
}

func jsonHeaders(n int) http.Header {
	return http.Header{"Content-Type": {"application/json"}, "Content-Length": {fmt.Sprint(n)}}
}

func waitABit() { time.Sleep(50 * time.Millisecond) }
