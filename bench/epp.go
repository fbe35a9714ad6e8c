package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/cartrouter/cart/dataplane/epp/epptest"
)

// Endpoint-picker scenarios: CART as the Gateway API Inference
// Extension's Endpoint Picker (`cart epp`), asked over ext_proc by the
// Envoy-like gateway of dataplane/epp/epptest, which runs in the bench
// process and forwards to the replicas. "cart-epp" is one picker with
// the router in process (as "cart"); "cart-epp-dist-N" is three
// control-plane nodes and N pickers asking them, the gateway's streams
// round robin over the pickers (as an Envoy cluster of picker endpoints
// balances them).
const (
	ScenarioEPP           = "cart-epp"
	ScenarioEPPDistPrefix = "cart-epp-dist-"
)

// startEPPs runs a picker scenario's processes and its gateway.
func (s *suite) startEPPs(ctx context.Context, dir, name string, d *deployment) error {
	n := 1
	var cps []string
	if name != ScenarioEPP {
		var err error
		if n, err = strconv.Atoi(strings.TrimPrefix(name, ScenarioEPPDistPrefix)); err != nil || n < 1 || n > 16 {
			return fmt.Errorf("bad scenario %q: want %sN with N in 1..16", name, ScenarioEPPDistPrefix)
		}
		if cps, err = s.startControlPlanes(ctx, dir, name, d); err != nil {
			return err
		}
		d.dataplanes = n
	}
	var conns []*grpc.ClientConn
	closeConns := func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}
	for i := range n {
		port, err1 := s.env.FreePort()
		mport, err2 := s.env.FreePort()
		if err := errors.Join(err1, err2); err != nil {
			closeConns()
			return err
		}
		conn, err := epptest.Dial(hostPort(port), nil)
		if err != nil {
			closeConns()
			return err
		}
		conns = append(conns, conn)
		id := fmt.Sprintf("epp%d", i+1)
		c := CartRouterConfig{Port: port, MetricsPort: mport, Workers: s.replicaURLs(), CacheTokens: s.cacheTokens, ControlPlanes: cps}
		if cps != nil {
			c.DataPlaneID = id
		}
		p, err := s.startRole(ctx, dir, name+"-"+id, "epp", c, pickerHealthy(conn, len(s.replicas)))
		if p != nil {
			d.procs = append(d.procs, p)
		}
		d.routers = append(d.routers, mport)
		if err != nil {
			closeConns()
			return fmt.Errorf("endpoint picker %s: %w", id, err)
		}
	}
	url, stop, err := serveGateway(&epptest.Gateway{Conns: conns})
	if err != nil {
		closeConns()
		return err
	}
	d.target = url
	d.stop = func() { stop(); closeConns() }
	return nil
}

// pickerHealthy is a readiness check of a picker: its gRPC readiness, and
// every worker healthy, as the proxy's /health says it (asked through an
// ext_proc stream: the picker answers it itself).
func pickerHealthy(conn *grpc.ClientConn, workers int) func() error {
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if ok, st := epptest.Ready(ctx, conn); !ok {
			return fmt.Errorf("readiness: %s", st)
		}
		st, err := epptest.Open(ctx, conn)
		if err != nil {
			return err
		}
		defer st.Reset()
		if err := st.Send(epptest.RequestHeaders(http.MethodGet, "/health", "bench", nil, true)); err != nil {
			return err
		}
		m, err := st.Recv()
		if err != nil {
			return err
		}
		ir, ok := m.GetResponse().(*extprocv3.ProcessingResponse_ImmediateResponse)
		if !ok {
			return fmt.Errorf("GET /health answered with %T", m.GetResponse())
		}
		var h struct {
			Healthy int `json:"healthy_workers"`
		}
		_ = json.Unmarshal(ir.ImmediateResponse.GetBody(), &h)
		if h.Healthy < workers {
			return fmt.Errorf("/health: %s", strings.TrimSpace(string(ir.ImmediateResponse.GetBody())))
		}
		return nil
	}
}

// serveGateway serves g on a loopback port of the bench process.
func serveGateway(g *epptest.Gateway) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}

// EPPOverheadResult compares the proxy path with the picker path in front
// of one replica that never sleeps: direct, CART's proxy, the gateway
// alone (a fixed route) and the gateway asking `cart epp`. What the picker
// path adds is gateway+picker minus the gateway alone (the gateway here
// is a Go stand-in for Envoy, so its own cost is not the picker's); what
// the proxy path adds is CART minus direct. CPU is the CART process's.
type EPPOverheadResult struct {
	Config OverheadConfig `json:"config"`
	// Rounds measure every target once each, in turn.
	Rounds [][]OverheadTarget `json:"rounds"`
	// Median is, per target, the round with the median p50.
	Median []OverheadTarget `json:"median"`
}

// RunEPPOverhead measures the targets in Rounds alternating rounds.
func RunEPPOverhead(ctx context.Context, env *Env, c OverheadConfig) EPPOverheadResult {
	res := EPPOverheadResult{Config: c}
	s := &suite{env: env, cfg: env.Cfg, cartBin: filepath.Join(env.Cfg.BinDir, "cart"), simBin: filepath.Join(env.Cfg.BinDir, "cart-sim")}
	names := []string{"direct", "cart", "gateway", "gateway+cart-epp"}
	skip := func(reason string) EPPOverheadResult {
		for _, n := range names {
			res.Median = append(res.Median, OverheadTarget{Name: n, Skipped: reason})
		}
		return res
	}
	port, err := env.FreePort()
	if err != nil {
		return skip(err.Error())
	}
	simProc, err := env.Start("epp-overhead-sim", s.simBin, "--listen", hostPort(port), "--name", "fast",
		"--time-scale", "0", "--max-concurrency", "1024", "--cache-tokens", "0")
	if err == nil {
		err = env.WaitReady(ctx, simProc, env.Cfg.StartTimeout, env.httpOK(baseURL(port)+"/health"))
	}
	if simProc != nil {
		defer env.StopAll([]*Proc{simProc})
	}
	if err != nil {
		return skip("replica: " + err.Error())
	}
	s.replicas = []*replica{{name: "fast", port: port}}
	dir := env.Path("epp-overhead")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return skip(err.Error())
	}
	var d deployment
	defer func() {
		env.StopAll(d.procs)
		if d.stop != nil {
			d.stop()
		}
	}()
	cport, err := env.FreePort()
	if err != nil {
		return skip(err.Error())
	}
	cartProcs, err := s.startCart(ctx, dir, "epp-overhead-cart", cport, "")
	d.procs = append(d.procs, cartProcs...)
	if err != nil {
		return skip("cart: " + err.Error())
	}
	nCart := len(d.procs)
	if err := s.startEPPs(ctx, dir, ScenarioEPP, &d); err != nil {
		return skip("cart epp: " + err.Error())
	}
	eppProcs := d.procs[nCart:]
	gwURL, gwStop, err := serveGateway(&epptest.Gateway{Static: hostPort(port)})
	if err != nil {
		return skip(err.Error())
	}
	defer gwStop()
	body := overheadBody(c.PromptChars)
	measure := func(name, base string, procs []*Proc) OverheadTarget {
		url := base + "/v1/chat/completions"
		cpu := func() (t time.Duration) {
			for _, p := range procs {
				t += p.CPUTime()
			}
			return t
		}
		if c.Warmup > 0 {
			LoadClosedLoop(ctx, url, body, c.Concurrency, c.Warmup, c.MaxRequests)
		}
		cpu0 := cpu()
		t := LoadClosedLoop(ctx, url, body, c.Concurrency, c.Duration, c.MaxRequests)
		if t.Requests > 0 && len(procs) > 0 {
			t.CPUUsPerReq = float64((cpu() - cpu0).Microseconds()) / float64(t.Requests)
		}
		t.Name = name
		return t
	}
	for range max(c.Rounds, 1) {
		if ctx.Err() != nil {
			break
		}
		res.Rounds = append(res.Rounds, []OverheadTarget{
			measure("direct", baseURL(port), []*Proc{simProc}),
			measure("cart", baseURL(cport), cartProcs),
			measure("gateway", gwURL, nil),
			measure("gateway+cart-epp", d.target, eppProcs),
		})
	}
	for i, n := range names {
		var col []OverheadTarget
		for _, r := range res.Rounds {
			col = append(col, r[i])
		}
		res.Median = append(res.Median, medianByP50(n, col))
	}
	return res
}

// medianByP50 returns the target whose p50 is the median of ts.
func medianByP50(name string, ts []OverheadTarget) OverheadTarget {
	if len(ts) == 0 {
		return OverheadTarget{Name: name, Skipped: "no round"}
	}
	s := append([]OverheadTarget(nil), ts...)
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j].P50Ms < s[j-1].P50Ms; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	return s[(len(s)-1)/2]
}

// FormatEPPOverhead renders the medians and what each path adds.
func FormatEPPOverhead(r EPPOverheadResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "closed loop, concurrency %d, %s per target, %d rounds (median by p50)\n", r.Config.Concurrency, r.Config.Duration, len(r.Rounds))
	b.WriteString("| target | req/s | p50 ms | p99 ms | CART CPU µs/req | errors |\n|---|---|---|---|---|---|\n")
	by := map[string]OverheadTarget{}
	for _, t := range r.Median {
		by[t.Name] = t
		if t.Skipped != "" {
			fmt.Fprintf(&b, "| %s | skipped: %s | | | | |\n", t.Name, t.Skipped)
			continue
		}
		cpu := "-"
		if t.Name != "direct" && t.Name != "gateway" {
			cpu = fmt.Sprintf("%.0f", t.CPUUsPerReq)
		}
		fmt.Fprintf(&b, "| %s | %.0f | %.3f | %.3f | %s | %d |\n", t.Name, t.ReqPerS, t.P50Ms, t.P99Ms, cpu, t.Errors)
	}
	d, c, g, e := by["direct"], by["cart"], by["gateway"], by["gateway+cart-epp"]
	fmt.Fprintf(&b, "\nadded by the proxy path (cart - direct): p50 %+.3f ms, p99 %+.3f ms, %.0f µs CPU/req in cart\n", c.P50Ms-d.P50Ms, c.P99Ms-d.P99Ms, c.CPUUsPerReq)
	fmt.Fprintf(&b, "added by the picker path (gateway+cart-epp - gateway): p50 %+.3f ms, p99 %+.3f ms, %.0f µs CPU/req in cart epp\n", e.P50Ms-g.P50Ms, e.P99Ms-g.P99Ms, e.CPUUsPerReq)
	return b.String()
}
