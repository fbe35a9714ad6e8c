package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/cpclient"
	"github.com/cartrouter/cart/dataplane/remote"
	"github.com/cartrouter/cart/dataplane/router"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
	"github.com/cartrouter/cart/sim"
)

// cpNode is one `cart controlplane` process.
type cpNode struct {
	id   string
	url  string // API base URL
	proc *Proc
}

// cpCluster is three control-plane processes on loopback and the workers
// they route to: in-process simulated replicas that only answer the
// leader's health probes and model listing (Route load never reaches a
// worker).
type cpCluster struct {
	env     *Env
	nodes   []*cpNode
	workers []*httptest.Server
	sims    []*sim.Server
	admin   map[string]cartv1connect.AdminServiceClient
	http    *http.Client
}

// cpClusterSpec is what differs between the control-plane benchmarks.
type cpClusterSpec struct {
	Nodes   int
	Workers int
	Model   string
	// Base is the config every node starts from (cache settings); node
	// identity, addresses and workers are filled in.
	Base         CartRouterConfig
	StartTimeout time.Duration
	// Procs is each node's GOMAXPROCS (0: Go's default, every CPU the
	// process may use).
	Procs int
}

// startCPCluster starts the workers and spec.Nodes control-plane nodes
// (the first bootstraps, the others join it) and waits until they form a
// cluster with a leader that sees every worker healthy.
func startCPCluster(ctx context.Context, env *Env, cartBin string, spec cpClusterSpec) (_ *cpCluster, err error) {
	c := &cpCluster{env: env, http: cpclient.NewWithTLS(nil), admin: map[string]cartv1connect.AdminServiceClient{}}
	defer func() {
		if err != nil {
			c.close()
		}
	}()
	var workerURLs []string
	for i := range spec.Workers {
		s := sim.New(sim.Config{Name: fmt.Sprintf("w%d", i+1), Models: []string{spec.Model}})
		ts := httptest.NewServer(s.Handler()) // 127.0.0.1
		c.sims, c.workers = append(c.sims, s), append(c.workers, ts)
		workerURLs = append(workerURLs, ts.URL)
	}
	dir, err := os.MkdirTemp(env.Dir, "cp-")
	if err != nil {
		return nil, err
	}
	for i := range spec.Nodes {
		api, err1 := env.FreePort()
		raft, err2 := env.FreePort()
		if err := errors.Join(err1, err2); err != nil {
			return nil, err
		}
		id := fmt.Sprintf("cp%d", i+1)
		nc := spec.Base
		nc.Workers, nc.NodeID, nc.APIAddr, nc.RaftAddr, nc.DataDir = workerURLs, id, hostPort(api), hostPort(raft), filepath.Join(dir, id)
		nc.Bootstrap, nc.Join = i == 0, nil
		if i > 0 {
			nc.Join = []string{c.nodes[0].url}
		}
		n := &cpNode{id: id, url: baseURL(api)}
		c.admin[n.url] = cartv1connect.NewAdminServiceClient(c.http, n.url)
		s := &suite{env: env, cfg: env.Cfg, cartBin: cartBin}
		n.proc, err = s.startRoleEnv(ctx, dir, id, "controlplane", nc, procsEnv(spec.Procs), tcpOpen(api))
		if n.proc != nil {
			c.nodes = append(c.nodes, n)
		}
		if err != nil {
			return nil, fmt.Errorf("control plane %s: %w", id, err)
		}
	}
	err = env.WaitReady(ctx, c.nodes[0].proc, spec.StartTimeout, func() error {
		st, err := c.status(ctx, c.nodes[0])
		if err != nil {
			return err
		}
		if len(st.GetMembers()) < spec.Nodes || st.GetLeaderId() == "" || st.GetHealthyWorkers() < uint32(spec.Workers) {
			return fmt.Errorf("leader %q, %d members, %d of %d workers healthy", st.GetLeaderId(), len(st.GetMembers()), st.GetHealthyWorkers(), spec.Workers)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("control-plane cluster: %w", err)
	}
	return c, nil
}

// procsEnv sets GOMAXPROCS to n, or for n <= 0 to empty, which Go
// ignores: a GOMAXPROCS in the bench's own environment would otherwise
// reach the nodes while the intros say they ran Go's default.
func procsEnv(n int) []string {
	if n <= 0 {
		return []string{"GOMAXPROCS="}
	}
	return []string{"GOMAXPROCS=" + strconv.Itoa(n)}
}

func (c *cpCluster) urls() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.url)
	}
	return out
}

func (c *cpCluster) status(ctx context.Context, n *cpNode) (*cartv1.ClusterStatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	r, err := c.admin[n.url].ClusterStatus(ctx, connect.NewRequest(&cartv1.ClusterStatusRequest{}))
	if err != nil {
		return nil, err
	}
	return r.Msg, nil
}

// leader asks the live nodes which of them leads, and its term; nil when
// none says it does.
func (c *cpCluster) leader(ctx context.Context) (*cpNode, uint64) {
	for _, n := range c.nodes {
		if done, _ := n.proc.Exited(); done {
			continue
		}
		if st, err := c.status(ctx, n); err == nil && st.GetState() == "leader" {
			return n, st.GetTerm()
		}
	}
	return nil, 0
}

// waitLeader polls leader until one answers or within passes.
func (c *cpCluster) waitLeader(ctx context.Context, within time.Duration) (*cpNode, uint64, error) {
	var ld *cpNode
	var term uint64
	err := c.env.WaitReady(ctx, nil, within, func() error {
		if ld, term = c.leader(ctx); ld == nil {
			return errors.New("no control-plane node is leader")
		}
		return nil
	})
	return ld, term, err
}

// metrics fetches a node's /metrics.
func (c *cpCluster) metrics(n *cpNode) (string, error) {
	code, body, err := c.env.Get(n.url + "/metrics")
	if err != nil {
		return "", err
	}
	if code != http.StatusOK {
		return "", fmt.Errorf("%s/metrics: %d", n.url, code)
	}
	return string(body), nil
}

func (c *cpCluster) close() {
	var ps []*Proc
	for _, n := range c.nodes {
		ps = append(ps, n.proc)
	}
	c.env.StopAll(ps)
	for i, ts := range c.workers {
		ts.Close()
		_ = c.sims[i].Close()
	}
	c.http.CloseIdleConnections()
}

// dataPlanes are in-process data planes: the data plane's own control-plane
// client (remote.Router, as `cart dataplane` builds it), so whatever
// transport it uses for Route is what gets measured.
type dataPlanes struct {
	routers []*remote.Router
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// dataPlaneOptions are remote.Options with the data plane's config
// defaults (route timeout, sync and report intervals, breaker, shadow);
// routeTimeout > 0 and balanceAbs > 0 override theirs.
func dataPlaneOptions(id string, cps []string, blockChars, balanceAbs int, routeTimeout time.Duration, client *http.Client, onFallback func(string)) remote.Options {
	d := config.Default()
	if routeTimeout <= 0 {
		routeTimeout = d.DataPlane.RouteTimeout()
	}
	if blockChars <= 0 {
		blockChars = d.Cache.BlockChars
	}
	balance := d.Cache.BalanceAbsThreshold
	if balanceAbs > 0 {
		balance = balanceAbs
	}
	return remote.Options{
		ID: id, ControlPlanes: cps, RouteTimeout: routeTimeout,
		SyncInterval:  time.Duration(d.DataPlane.WorkerSyncIntervalMs) * time.Millisecond,
		FlushInterval: time.Duration(d.DataPlane.ReportIntervalMs) * time.Millisecond,
		HTTPClient:    client, BlockChars: blockChars,
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnFallback: onFallback,
		Shadow: remote.ShadowOptions{Entries: remote.DefaultShadowEntries, Threshold: d.Cache.Threshold, MatchAbsChars: d.Cache.MatchAbsThreshold,
			BalanceAbs: balance, BalanceRel: d.Cache.BalanceRelThreshold},
		RouteBreakerFailures: d.DataPlane.RouteBreakerFailures,
		RouteBreakerCooloff:  d.DataPlane.RouteBreakerCooloff(),
		RouteStream:          d.DataPlane.RouteStream, RouteStreamMaxInFlight: d.DataPlane.RouteStreamMaxInFlight,
		PlacementFeed: d.DataPlane.RouteStreamPlacementFeed,
	}
}

// startDataPlanes runs n routers (each with its own connection pool, as
// separate processes would have) and waits until each has synced the
// worker set with workers healthy.
func startDataPlanes(ctx context.Context, env *Env, n, workers int, opts func(i int, client *http.Client) remote.Options, within time.Duration) (*dataPlanes, error) {
	rctx, cancel := context.WithCancel(context.Background())
	d := &dataPlanes{cancel: cancel}
	for i := range n {
		// Its own transport, as a separate process has: a shared one would
		// multiplex every data plane's calls on one HTTP/2 connection.
		client := cpclient.NewWithTLS(nil)
		r := remote.New(opts(i, client))
		d.routers = append(d.routers, r)
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			defer client.CloseIdleConnections()
			r.Run(rctx)
		}()
	}
	err := env.WaitReady(ctx, nil, within, func() error {
		for i, r := range d.routers {
			healthy := 0
			for _, w := range r.Workers() {
				if w.Healthy {
					healthy++
				}
			}
			if !r.Synced() || healthy < workers {
				return fmt.Errorf("data plane %d: synced %t, %d of %d workers healthy", i, r.Synced(), healthy, workers)
			}
		}
		return nil
	})
	if err != nil {
		d.stop()
		return nil, err
	}
	return d, nil
}

// stop ends the routers' sync and flush loops and waits for them.
func (d *dataPlanes) stop() {
	d.cancel()
	d.wg.Wait()
}

// settle hands a decision back as a data plane does when the response
// ends: the completion goes out with the next batch.
func settle(r *remote.Router, d router.Decision, delivered bool) {
	r.Done(d, router.Outcome{Delivered: delivered, PromptTokens: -1, CachedTokens: -1})
}
