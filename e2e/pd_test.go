package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/internal/testkit/proc"
	"github.com/cartrouter/cart/sim"
)

// Prefill/decode disaggregation end to end: real cart-sim processes in
// their prefill and decode roles (vLLM's NIXL protocol: a decode replica
// pulls the prompt's blocks from the prefill replica named in the
// kv_transfer_params it gets, and the prefill replica hands out exactly
// the engine, blocks and request id it held them under), CART all-in-one
// and distributed (a control-plane node and a data plane) in front.

// simProc is a cart-sim process.
type simProc struct {
	*proc.Proc
	name, role, url string
}

func startSims(t *testing.T, bin string, extra []string, roles ...string) []*simProc {
	t.Helper()
	var out []*simProc
	for i, role := range roles {
		addr := testkit.FreeAddr(t)
		s := &simProc{name: fmt.Sprintf("%s-%d", role, i), role: role, url: "http://" + addr}
		args := append([]string{"--listen", addr, "--name", s.name, "--pd-role", role, "--block-tokens", "16",
			"--prefill-us-per-token", "20", "--decode-ms-per-token", "15", "--output-tokens", "8", "--max-concurrency", "8",
			"--kv-transfer-ms", "2"}, extra...)
		s.Proc = proc.Start(t, proc.Cmd{Name: s.name, Path: bin, Args: args})
		out = append(out, s)
	}
	for _, s := range out {
		s.WaitFor(t, 15*time.Second, "listening", proc.HTTPOK(s.url+"/health"))
	}
	return out
}

func (s *simProc) stats(t *testing.T) sim.Stats {
	t.Helper()
	var st sim.Stats
	resp, err := plain.Get(s.url + "/sim/stats")
	if err != nil {
		t.Fatalf("%s stats: %v", s.name, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || st.PD == nil {
		t.Fatalf("%s stats: %v %+v", s.name, err, st)
	}
	return st
}

func workersYAML(sims []*simProc) string {
	var sb strings.Builder
	sb.WriteString("workers:\n")
	for _, s := range sims {
		fmt.Fprintf(&sb, "  - {url: %s, role: %s}\n", s.url, s.role)
	}
	return sb.String()
}

// pdBase is the configuration every router of these tests shares: health
// checks that notice a killed replica fast, and a retry budget that lets
// every request caught by a kill be retried (the default floor, 3, is for
// a fleet; these tests kill a replica under 4 concurrent requests).
const pdBase = `log: {level: warn, format: text}
proxy: {add_routed_peer_header: true, retry_budget_min: 16, max_retries: 3}
health: {interval_secs: 0.3, timeout_secs: 0.3, failure_threshold: 1}
`

func startAllInOnePD(t *testing.T, cartBin string, sims []*simProc, extra string) *httpNode {
	t.Helper()
	dir := t.TempDir()
	a := &httpNode{id: "aio-pd", addr: testkit.FreeAddr(t)}
	_, port, _ := net.SplitHostPort(a.addr)
	cfg := filepath.Join(dir, "aio.yaml")
	writeFile(t, cfg, fmt.Sprintf("server: {host: 127.0.0.1, port: %s, min_open_files: 0, shutdown_grace_secs: 1}\n", port)+pdBase+extra+workersYAML(sims))
	a.Proc = proc.Start(t, proc.Cmd{Name: a.id, Path: cartBin, Args: []string{"-c", cfg}})
	a.WaitFor(t, 20*time.Second, "ready", proc.HTTPOK(a.url()+"/health"))
	return a
}

func startDistributedPD(t *testing.T, cartBin string, sims []*simProc) (cp *cpNode, dp *httpNode) {
	t.Helper()
	dir := t.TempDir()
	cp = &cpNode{id: "n1", api: testkit.FreeAddr(t), raft: testkit.FreeAddr(t)}
	cfg := filepath.Join(dir, "cp.yaml")
	writeFile(t, cfg, fmt.Sprintf(`server: {min_open_files: 0}
controlplane: {node_id: n1, api_addr: %s, raft_addr: %s, data_dir: %s, bootstrap: true, load_lease_secs: %d}
`, cp.api, cp.raft, filepath.Join(dir, "raft"), loadLeaseSecs)+pdBase+workersYAML(sims))
	cp.Proc = proc.Start(t, proc.Cmd{Name: "cp-n1", Path: cartBin, Args: []string{"controlplane", "-c", cfg}})
	cp.WaitFor(t, 20*time.Second, "API up", func() (bool, string) {
		resp, err := plain.Get(cp.url() + "/health")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode < 500, resp.Status
	})
	dp = &httpNode{id: "dp-pd", addr: testkit.FreeAddr(t)}
	_, port, _ := net.SplitHostPort(dp.addr)
	dcfg := filepath.Join(dir, "dp.yaml")
	writeFile(t, dcfg, fmt.Sprintf(`server: {host: 127.0.0.1, port: %s, min_open_files: 0, shutdown_grace_secs: 1}
dataplane: {id: dp-pd, control_plane: [%s], route_timeout_ms: %d, worker_sync_interval_ms: 200}
`, port, cp.url(), routeTimeoutMs)+pdBase)
	dp.Proc = proc.Start(t, proc.Cmd{Name: dp.id, Path: cartBin, Args: []string{"dataplane", "-c", dcfg}})
	urls := make([]string, len(sims))
	for i, s := range sims {
		urls[i] = s.url
	}
	dp.WaitFor(t, 20*time.Second, "synced", func() (bool, string) {
		if ok, last := proc.HTTPOK(dp.url() + "/health")(); !ok {
			return false, last
		}
		got, err := routerWorkers(dp.url())
		return err == nil && sameSet(got, urls), fmt.Sprint(got, err)
	})
	return cp, dp
}

// pdResult is one client request's outcome.
type pdResult struct {
	status          int
	decode, prefill string // X-Routed-Peer, X-Routed-Prefill-Peer
	chunks          int    // SSE data events read
	spread          time.Duration
	err             error // a broken stream or transport error
}

// streamChat sends a streamed chat completion and reads its events.
func streamChat(base, prompt string) pdResult {
	body, _ := json.Marshal(map[string]any{"model": "cart-sim", "stream": true, "max_tokens": 8,
		"messages": []map[string]string{{"role": "user", "content": prompt}}})
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		return pdResult{err: err}
	}
	defer resp.Body.Close()
	r := pdResult{status: resp.StatusCode, decode: resp.Header.Get(proxy.HeaderRoutedPeer), prefill: resp.Header.Get(proxy.HeaderRoutedPrefillPeer)}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		r.err = fmt.Errorf("status %d: %s", resp.StatusCode, b)
		return r
	}
	sc := bufio.NewScanner(resp.Body)
	var first time.Time
	done := false
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		if first.IsZero() {
			first = time.Now()
		}
		r.chunks++
		if line == "data: [DONE]" {
			done = true
		}
	}
	r.spread = time.Since(first)
	if err := sc.Err(); err != nil {
		r.err = err
	} else if !done {
		r.err = io.ErrUnexpectedEOF
	}
	return r
}

// runPD sends n requests, conc at a time, over a few shared prefixes (so
// prefill workers have cache to hit). during runs after the kth request.
func runPD(base string, n, conc, k int, during func()) []pdResult {
	out := make([]pdResult, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if i == k && during != nil {
					once.Do(during)
				}
				prompt := strings.Repeat(fmt.Sprintf("shared system prompt %d. ", i%3), 40) + fmt.Sprintf("question %d", i)
				out[i] = streamChat(base, prompt)
			}
		}()
	}
	wg.Wait()
	return out
}

// routerLoad sums a router's /workers loads.
func routerLoad(base string) (int, error) {
	resp, err := plain.Get(base + "/workers")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var v struct {
		Workers []struct {
			Load int `json:"load"`
		} `json:"workers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return 0, err
	}
	n := 0
	for _, w := range v.Workers {
		n += w.Load
	}
	return n, nil
}

func waitRouterIdle(t *testing.T, base string) {
	t.Helper()
	testkit.WaitForMsg(t, 15*time.Second, "load back to zero at "+base, func() (bool, string) {
		n, err := routerLoad(base)
		return err == nil && n == 0, fmt.Sprint("load ", n, " ", err)
	})
}

func roleOfURL(sims []*simProc, u string) string {
	for _, s := range sims {
		if s.url == u {
			return s.role
		}
	}
	return "?"
}

// checkSplitRun asserts what a clean run shows: every request split, its
// decode answer streamed, every decode leg's pull accepted by its prefill
// replica (which checks engine, blocks and request id byte for byte: the
// kv_transfer_params reached the decode worker exactly), nothing left held.
func checkSplitRun(t *testing.T, sims []*simProc, res []pdResult) {
	t.Helper()
	for i, r := range res {
		if r.err != nil {
			t.Fatalf("request %d: %v", i, r.err)
		}
		if roleOfURL(sims, r.decode) != sim.RoleDecode || roleOfURL(sims, r.prefill) != sim.RolePrefill {
			t.Fatalf("request %d: decode %q prefill %q", i, r.decode, r.prefill)
		}
		// 8 tokens at 15 ms each: a buffered answer would arrive at once.
		if r.chunks < 8 || r.spread < 40*time.Millisecond {
			t.Fatalf("request %d: %d events over %v: not streamed", i, r.chunks, r.spread)
		}
	}
	var prefills, decodes, claimed, failures, pending int64
	for _, s := range sims {
		st := s.stats(t).PD
		prefills += st.PrefillLegs
		decodes += st.DecodeLegs
		claimed += st.TransfersClaimed
		failures += st.PullFailures
		pending += st.TransfersPending
	}
	n := int64(len(res))
	if prefills != n || decodes != n || claimed != n || failures != 0 || pending != 0 {
		t.Fatalf("%d requests: prefill legs %d, decode legs %d, pulls accepted %d, failed %d, held %d", n, prefills, decodes, claimed, failures, pending)
	}
}

func TestPDAllInOneWithCartSim(t *testing.T) {
	cartBin := proc.Build(t, "github.com/cartrouter/cart/cli/cart")
	simBin := proc.Build(t, "github.com/cartrouter/cart/cli/cart-sim")
	sims := startSims(t, simBin, nil, sim.RolePrefill, sim.RolePrefill, sim.RoleDecode, sim.RoleDecode)
	aio := startAllInOnePD(t, cartBin, sims, "")
	res := runPD(aio.url(), 24, 4, -1, nil)
	checkSplitRun(t, sims, res)
	waitRouterIdle(t, aio.url())
	m := scrape(t, aio.url())
	if m[`cart_pd_decisions_total{outcome="split"}`] != 24 || m[`cart_routing_decisions_total{reason="pd"}`] != 24 {
		t.Fatalf("pd metrics: %v", m)
	}
	// The prefixes come back: the prefill workers hit their cache.
	var prompt, cached int64
	for _, s := range sims[:2] {
		st := s.stats(t)
		prompt, cached = prompt+st.PromptTokens, cached+st.CachedTokens
	}
	if cached*2 < prompt {
		t.Fatalf("prefill workers hit %d of %d prompt tokens: the prefill choice is not cache-aware", cached, prompt)
	}
}

func TestPDDistributedWithCartSim(t *testing.T) {
	cartBin := proc.Build(t, "github.com/cartrouter/cart/cli/cart")
	simBin := proc.Build(t, "github.com/cartrouter/cart/cli/cart-sim")
	sims := startSims(t, simBin, nil, sim.RolePrefill, sim.RolePrefill, sim.RoleDecode, sim.RoleDecode)
	_, dp := startDistributedPD(t, cartBin, sims)
	res := runPD(dp.url(), 24, 4, -1, nil)
	checkSplitRun(t, sims, res)
	waitRouterIdle(t, dp.url())
	if f, _ := fallbacks(dp.url()); f != 0 {
		t.Logf("%v requests fell back to local routing (the leader was slow to answer)", f)
	}
	if m := scrape(t, dp.url()); m[`cart_pd_decisions_total{outcome="split"}`] != 24 {
		t.Fatalf("pd metrics: %v", m)
	}
}

// A prefill worker killed mid-run: the requests it had are retried on the
// other prefill worker (or decoded whole); no client sees an error, the
// load returns to zero.
func TestPDPrefillKilledMidRun(t *testing.T) {
	for _, mode := range []string{"all-in-one", "distributed"} {
		t.Run(mode, func(t *testing.T) {
			cartBin := proc.Build(t, "github.com/cartrouter/cart/cli/cart")
			simBin := proc.Build(t, "github.com/cartrouter/cart/cli/cart-sim")
			sims := startSims(t, simBin, []string{"--prefill-us-per-token", "400"}, sim.RolePrefill, sim.RolePrefill, sim.RoleDecode, sim.RoleDecode)
			base := pdRouter(t, mode, cartBin, sims)
			res := runPD(base, 40, 4, 10, func() { sims[0].Kill() })
			for i, r := range res {
				if r.err != nil {
					t.Fatalf("request %d: %v (prefill %s, decode %s)", i, r.err, r.prefill, r.decode)
				}
			}
			if n := sumSeries(scrape(t, base), "cart_retries_total"); n == 0 {
				t.Fatal("no request was retried: the kill caught nothing in flight")
			}
			waitRouterIdle(t, base)
		})
	}
}

// A decode worker killed mid-run: streams it had started break (nothing
// can be retried once bytes reached the client); every other request is
// retried and succeeds; the load returns to zero, and prefills whose
// decode never pulled them are released after the hold time.
func TestPDDecodeKilledMidRun(t *testing.T) {
	for _, mode := range []string{"all-in-one", "distributed"} {
		t.Run(mode, func(t *testing.T) {
			cartBin := proc.Build(t, "github.com/cartrouter/cart/cli/cart")
			simBin := proc.Build(t, "github.com/cartrouter/cart/cli/cart-sim")
			sims := startSims(t, simBin, []string{"--kv-hold-secs", "2"}, sim.RolePrefill, sim.RolePrefill, sim.RoleDecode, sim.RoleDecode)
			base := pdRouter(t, mode, cartBin, sims)
			killed := sims[2]
			res := runPD(base, 40, 4, 10, func() { killed.Kill() })
			broken := 0
			for i, r := range res {
				if r.err == nil {
					continue
				}
				if r.status == 200 && r.decode == killed.url && r.chunks > 0 {
					broken++ // its stream had started on the killed worker
					continue
				}
				t.Fatalf("request %d failed where a retry was possible: %v (status %d, decode %s, %d events)", i, r.err, r.status, r.decode, r.chunks)
			}
			t.Logf("%d streams broke with the decode worker that carried them", broken)
			if n := sumSeries(scrape(t, base), "cart_retries_total"); n == 0 && broken == 0 {
				t.Fatal("no stream broke and no request was retried: the kill caught nothing in flight")
			}
			waitRouterIdle(t, base)
			testkit.WaitForMsg(t, 10*time.Second, "no prefill blocks held", func() (bool, string) {
				var held int64
				for _, s := range sims[:2] {
					held += s.stats(t).PD.TransfersPending
				}
				return held == 0, fmt.Sprint(held, " held")
			})
		})
	}
}

// pdRouter starts CART in mode over sims and returns its client URL.
func pdRouter(t *testing.T, mode, cartBin string, sims []*simProc) string {
	t.Helper()
	if mode == "all-in-one" {
		return startAllInOnePD(t, cartBin, sims, "").url()
	}
	_, dp := startDistributedPD(t, cartBin, sims)
	return dp.url()
}

// sumSeries sums the samples of a metric, all label sets.
func sumSeries(m map[string]float64, name string) float64 {
	n := 0.0
	for k, v := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			n += v
		}
	}
	return n
}

// scrape reads a router's /metrics samples by series.
func scrape(t *testing.T, base string) map[string]float64 {
	t.Helper()
	resp, err := plain.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(line[i+1:], &v); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}
