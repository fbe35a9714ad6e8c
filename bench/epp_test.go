package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/dataplane/epp/epptest"
	"github.com/cartrouter/cart/dataplane/router"
	"github.com/cartrouter/cart/dataplane/server"
	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/sim"
	"github.com/cartrouter/cart/sim/simtest"
)

// The endpoint picker routes as the proxy does on the shared traces: a
// slice of each is replayed one request at a time through CART's proxy
// (the all-in-one router) and through `cart epp`'s code behind the
// Envoy-like gateway, each time on four freshly reset replicas whose
// prefix caches are bounded, with the same routing seed. Both hit ratios
// (Σ cached / Σ prompt tokens, as the replicas report them) must be within
// one point of each other. One request at a time makes the comparison
// about routing: with the same decisions in the same order, the two paths
// give the same figure; concurrency would add the noise of who arrives
// first (bench/results/2026-12-07-epp has the open-loop suite).
func TestEPPRoutesLikeTheProxyOnTheTraces(t *testing.T) {
	if testing.Short() {
		t.Skip("replays trace slices")
	}
	dir := filepath.Join("..", "..", "shared", "traces")
	for _, tr := range []struct {
		name        string
		limit       int
		cacheTokens int
	}{
		{"sglang_gsp_default_blk512", 256, 40960},
		{"mooncake_conversation", 160, 1 << 17},
		{"llmd_shared_prefix_73pct_blk512", 120, 65536},
	} {
		t.Run(tr.name, func(t *testing.T) {
			path := filepath.Join(dir, tr.name+".jsonl")
			if _, err := os.Stat(path); err != nil {
				t.Skipf("trace %s: %v", path, err)
			}
			recs, err := LoadTrace(path)
			if err != nil {
				t.Fatal(err)
			}
			w := TraceWorkload(tr.name, SliceTrace(recs, 0, tr.limit), TraceOptions{Speedup: 1e9, MaxTokensCap: 4})
			var reps []*simtest.Replica
			var names []string
			for i := range 4 {
				r := simtest.Start(t, sim.Config{Name: fmt.Sprint("r", i), BlockTokens: 16, OutputTokens: 4, CacheTokens: tr.cacheTokens})
				reps, names = append(reps, r), append(names, fmt.Sprint("r", i))
			}
			h := map[string]float64{}
			for _, path := range []string{"proxy", "epp"} {
				for _, r := range reps {
					r.Reset()
				}
				base, load := startRouter(t, path, reps, tr.cacheTokens)
				hc := NewHTTPClient(4)
				res := Run(context.Background(), w, &settled{Sender: NewOpenAISender(base, "cart-sim", hc), load: load}, RunOptions{Concurrency: 1, BlockTokens: 16})
				hc.CloseIdleConnections()
				s := Summarize(res, names)
				if s.Errors > 0 || s.Succeeded != len(w.Requests) {
					t.Fatalf("%s: %d of %d succeeded, errors %v", path, s.Succeeded, len(w.Requests), s.ErrorKinds)
				}
				var p, c int64
				for _, r := range reps {
					st := r.Stats()
					p, c = p+st.PromptTokens, c+st.CachedTokens
				}
				h[path] = float64(c) / float64(max(p, 1))
				t.Logf("%-5s hit ratio %.4f (client %.4f, oracle %.4f), per replica %v", path, h[path], s.HitRatio, s.OracleHitRatio, s.PerReplica)
			}
			if d := math.Abs(h["epp"] - h["proxy"]); d > 0.01 {
				t.Errorf("hit ratio through the picker %.4f, through the proxy %.4f: %.4f apart, want within 0.01", h["epp"], h["proxy"], d)
			}
		})
	}
}

// settled sends the next request only once the router holds no load: a
// client may read a stream's last bytes before the router has released
// the request's load (the proxy settles at the worker's end of stream,
// the gateway forwards the picker's last chunk at the same time), and a
// decision made in between would see a busy worker on one path and not
// on the other.
type settled struct {
	Sender
	load func() int
}

func (s *settled) Send(ctx context.Context, msgs []Message, maxTokens int, keep bool) Result {
	r := s.Sender.Send(ctx, msgs, maxTokens, keep)
	for deadline := time.Now().Add(5 * time.Second); s.load() != 0 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Microsecond)
	}
	return r
}

// startRouter runs CART in front of reps until the test ends, as the proxy
// or as a picker behind a gateway, and returns the URL clients use and
// the router's total load.
func startRouter(t *testing.T, kind string, reps []*simtest.Replica, cacheTokens int) (string, func() int) {
	t.Helper()
	cfg := config.Default()
	for _, r := range reps {
		cfg.Workers = append(cfg.Workers, config.Worker{URL: r.URL, CacheCapacityTokens: int64(cacheTokens)})
	}
	cfg.Server.Host, cfg.Server.MinOpenFiles, cfg.Server.ShutdownGraceSecs = "127.0.0.1", 0, 1
	cfg.Health.IntervalSecs = 3600
	cfg.Log.Level = "error"
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	const seed = 42 // the same tie-breaking on both paths
	if kind == "proxy" {
		a, err := server.NewAllInOne(cfg, nil, log, seed)
		if err != nil {
			t.Fatal(err)
		}
		return "http://" + testkit.RunOnLoopback(t, a.Run), totalLoad(a.Router.Workers)
	}
	cfg.Server.MetricsAddr = testkit.FreeAddr(t)
	if err := cfg.Validate(config.RoleEPP); err != nil {
		t.Fatal(err)
	}
	e, err := server.NewEPP(cfg, nil, log, seed, nil)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := epptest.Dial(testkit.RunOnLoopback(t, e.Run), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	gw := httptest.NewServer(&epptest.Gateway{Conn: conn})
	t.Cleanup(gw.Close)
	return gw.URL, totalLoad(e.AllInOne.Router.Workers)
}

func totalLoad(workers func() []router.WorkerStatus) func() int {
	return func() int {
		n := 0
		for _, w := range workers() {
			n += w.Load
		}
		return n
	}
}
