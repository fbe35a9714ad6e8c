// Package daemon runs one control-plane node: Raft on disk, the replicated
// state over the node's decider, and the Connect API on one port.
package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/cpclient"
	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/discovery"
	"github.com/cartrouter/cart/controlplane/enginemetrics"
	"github.com/cartrouter/cart/controlplane/health"
	"github.com/cartrouter/cart/controlplane/kvtruth"
	"github.com/cartrouter/cart/controlplane/raftnode"
	"github.com/cartrouter/cart/controlplane/service"
	"github.com/cartrouter/cart/controlplane/state"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
	"github.com/cartrouter/cart/internal/bufconn"
	"github.com/cartrouter/cart/internal/tracing"
)

// Daemon is a running control-plane node.
type Daemon struct {
	cfg  *config.Config
	log  *slog.Logger
	Core *service.Core
	Node *raftnode.Node
	St   *state.State
	API  *http.Server
	// Dec is the node's routing core: the engine, its lock, load, tickets
	// and index maintenance, shared by the state machine and the service.
	Dec *decider.Decider
	// watchers are discovery (DNS, Kubernetes), run by whichever node
	// leads.
	watchers []*discovery.Watcher
	// seeded is closed once a bootstrapping node decided about the static
	// seed (nil on other nodes).
	seeded chan struct{}
	// Tracer continues data planes' traces in RouterService calls (nil:
	// off); ownTracer: Serve shuts it down.
	Tracer    *tracing.Tracer
	ownTracer bool
}

// raftTLS builds the Raft transport's server and client TLS from one
// certificate and CA: every node is both.
func raftTLS(t config.TLS) (*tls.Config, *tls.Config, error) {
	if !t.Enabled() {
		return nil, nil, nil
	}
	srv, err := t.ServerConfig()
	if err != nil {
		return nil, nil, fmt.Errorf("raft TLS: %w", err)
	}
	// The CA that verifies peers' client certificates verifies their
	// server certificates too: one pool, loaded once.
	cli := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: srv.Certificates, RootCAs: srv.ClientCAs}
	return srv, cli, nil
}

// declaredModels maps configured workers to their workers[].models; the
// leader adds them to what it probes (for workers added later through
// cartctl, probing alone says what they serve).
func declaredModels(ws []config.Worker) map[string][]string {
	out := map[string][]string{}
	for _, w := range ws {
		if len(w.Models) > 0 {
			out[w.URL] = w.Models
		}
	}
	return out
}

// Start brings the node up: Raft (bootstrapping or rejoining), the API
// listener, and — for a joining node — the request to be added as a voter.
func Start(ctx context.Context, cfg *config.Config, log *slog.Logger, opts ...tracing.Option) (*Daemon, error) {
	token, adminToken, err := cfg.Tokens()
	if err != nil {
		return nil, err
	}
	raftToken, err := cfg.RaftToken()
	if err != nil {
		return nil, err
	}
	// The handshake of releases before the Raft token, keyed by the
	// cluster token: accepted only during a rolling upgrade.
	legacyRaftToken := ""
	if cfg.Auth.RaftAcceptClusterToken {
		if raftToken == "" || token == "" {
			return nil, errors.New("auth.raft_accept_cluster_token needs both auth.raft_token_file and auth.token_file")
		}
		legacyRaftToken = token
	}
	// The leader probes workers; keyed workers (vLLM --api-key) need their
	// key on probes or they are all marked down.
	workerKeys, err := cfg.WorkerKeys()
	if err != nil {
		return nil, err
	}
	healthCfg := health.ConfigFrom(cfg.Health)
	cp := cfg.ControlPlane
	client, err := cpclient.New(cfg.DataPlane.ClientTLS)
	if err != nil {
		return nil, err
	}
	d := &Daemon{cfg: cfg, log: log}
	if cp.Bootstrap {
		d.seeded = make(chan struct{})
	}
	d.Dec = decider.New(deciderOptions(cfg))
	// The pool key goes only to workers of the sources trusted with it
	// (proxy.worker_api_key_sources): a discovered endpoint is not the
	// operator's word.
	healthCfg.WorkerKey = func(w string) string {
		src, ok := d.Dec.WorkerSource(w)
		if !ok {
			return ""
		}
		return workerKeys.Get(w, src)
	}
	d.St = state.New(d.Dec)
	var leaderLoops []func(context.Context)
	if cfg.Discovery.DNS.Enabled() || cfg.Discovery.Kubernetes.Enabled {
		// d.watchers is set below, before Raft can make this node leader.
		leaderLoops = append(leaderLoops, func(ctx context.Context) {
			// The seed only lands on a cluster with no worker history, so
			// discovery must not write the first worker change.
			if d.seeded != nil {
				select {
				case <-d.seeded:
				case <-ctx.Done():
					return
				}
			}
			// Each watcher stops (Kubernetes informers included) when
			// leadership ends; the loop returns once all have.
			var wg sync.WaitGroup
			for _, w := range d.watchers {
				wg.Add(1)
				go func() { defer wg.Done(); w.Run(ctx) }()
			}
			wg.Wait()
		})
	}
	if cfg.Flow.Enabled && cfg.Flow.LearnConcurrency {
		// The engines' metrics, read once per pool like their health: the
		// leader learns each worker's concurrency for the fleet's queue.
		leaderLoops = append(leaderLoops, func(ctx context.Context) {
			s := &enginemetrics.Scraper{
				Client:   &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()},
				Path:     cfg.Flow.MetricsEndpoint,
				Interval: config.Seconds(cfg.Flow.MetricsIntervalSecs),
				Timeout:  min(config.Seconds(cfg.Flow.MetricsIntervalSecs), healthCfg.Timeout),
				Workers: func() []string {
					ws, _ := d.St.Workers()
					out := make([]string, len(ws))
					for i, w := range ws {
						out[i] = w.URL
					}
					return out
				},
				Key:     healthCfg.WorkerKey,
				Observe: d.Dec.ObserveEngine,
				Log:     log,
			}
			s.Run(ctx)
		})
	}
	var kvLoop func(context.Context)
	if len(kvtruth.SourcesFrom(cfg)) > 0 {
		// kvLoop is set below, before Raft can make this node leader.
		leaderLoops = append(leaderLoops, func(ctx context.Context) { kvLoop(ctx) })
	}
	d.Core = service.New(service.Options{
		NodeID:         cp.NodeID,
		APIURL:         cp.EffectiveAdvertiseAPIURL(),
		BlockChars:     cfg.Cache.BlockChars,
		FlowOn:         cfg.Flow.Enabled,
		PlacementBatch: time.Duration(cp.PlacementBatchMs) * time.Millisecond,
		PlacementMax:   cp.PlacementBatchMax,
		Health:         healthCfg,
		DeclaredModels: declaredModels(cfg.Workers),
		Token:          token,
		AdminToken:     adminToken,
		Logger:         log,
		ForwardClient:  client,
		LeaderLoops:    leaderLoops,

		ResponseAffinityTTL: cfg.Responses.AffinityTTL(),
		ResponseAffinityMax: cfg.Responses.MaxEntries,
		SlowLeader: service.HandoverOptions{Enabled: cfg.ControlPlane.SlowLeaderHandover.Enabled, Threshold: cfg.ControlPlane.SlowLeaderHandover.Threshold(),
			Window: cfg.ControlPlane.SlowLeaderHandover.Window(), MinInterval: cfg.ControlPlane.SlowLeaderHandover.MinInterval()},
		WorkerWritesAfter: d.seeded, // nil unless bootstrapping: no wait
	}, d.Dec, d.St)
	if len(kvtruth.SourcesFrom(cfg)) > 0 {
		kvLoop = d.kvLeaderLoop(kvtruth.NewMetrics(d.Core.Registry()))
	}
	if d.watchers, err = discovery.Watchers(cfg, log, discovery.NewMetrics(d.Core.Registry()),
		func(source string) discovery.Sink { return cpSink{d, source} }, cfg.Listeners(config.RoleControlPlane)...); err != nil {
		return nil, err
	}
	srvTLS, cliTLS, err := raftTLS(cp.RaftTLS)
	if err != nil {
		return nil, err
	}
	if err := checkRaftAuth(cp, raftToken, srvTLS); err != nil {
		return nil, err
	}
	switch {
	case legacyRaftToken != "":
		log.Warn("raft peers authenticate with the Raft token, and also with the cluster token (auth.raft_accept_cluster_token, for a rolling upgrade): "+
			"until it is removed, any holder of the cluster token (every data plane) can act as a Raft peer",
			"raft_tls", srvTLS != nil, "mutual_tls", srvTLS != nil && srvTLS.ClientCAs != nil)
	case raftToken != "":
		log.Info("raft peers authenticate with a handshake keyed by the Raft token", "raft_tls", srvTLS != nil, "mutual_tls", srvTLS != nil && srvTLS.ClientCAs != nil)
	case srvTLS != nil && srvTLS.ClientCAs != nil:
		log.Info("raft peers authenticate with mutual TLS")
	default:
		log.Warn("raft peers are not authenticated: anyone who reaches the Raft port can act as a peer; set auth.raft_token_file or controlplane.raft_tls with client_ca_file",
			"raft_addr", cp.RaftAddr)
	}
	if err := os.MkdirAll(cp.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	existing, err := raftnode.HasExistingState(cp.DataDir)
	if err != nil {
		return nil, err
	}
	node, err := raftnode.Start(raftnode.Config{
		NodeID:            cp.NodeID,
		BindAddr:          cp.RaftAddr,
		AdvertiseAddr:     cp.EffectiveAdvertiseRaftAddr(),
		DataDir:           cp.DataDir,
		LogStore:          cp.LogStore,
		Bootstrap:         cp.Bootstrap,
		ServerTLS:         srvTLS,
		ClientTLS:         cliTLS,
		RaftToken:         raftToken,
		LegacyToken:       legacyRaftToken,
		HandshakeTimeout:  time.Duration(cp.RaftHandshakeTimeoutMs) * time.Millisecond,
		MaxInboundConns:   cp.RaftMaxConns,
		SnapshotThreshold: cp.SnapshotThreshold,
		TrailingLogs:      cp.TrailingLogs,
		Logger:            log,
		// Configurable; the defaults are half of hashicorp/raft's LAN
		// values: data planes fall back locally during an election, so a
		// faster election (about 1-2 s after a crash instead of 2-3 s)
		// costs little.
		Timeouts: &raftnode.Timeouts{
			Heartbeat:   time.Duration(cp.HeartbeatTimeoutMs) * time.Millisecond,
			Election:    time.Duration(cp.ElectionTimeoutMs) * time.Millisecond,
			LeaderLease: time.Duration(cp.LeaderLeaseTimeoutMs) * time.Millisecond,
			Commit:      50 * time.Millisecond,
		},
	}, d.St, d.Core.OnLeadership)
	if err != nil {
		return nil, fmt.Errorf("start raft: %w", err)
	}
	d.Node = node
	d.Core.SetNode(node)

	if d.Tracer, d.ownTracer, err = tracing.ForRole(cfg, config.RoleControlPlane, cp.NodeID, opts, log); err != nil {
		_ = node.Shutdown()
		return nil, err
	}
	h := d.Core.HandlerWith(service.AuthOptions{Token: token, AdminToken: adminToken, AllowUnauthenticatedRemote: cfg.Auth.AllowUnauthenticatedRemote, DebugPprof: cp.DebugPprof},
		d.Tracer.Interceptors()...)
	api := &http.Server{
		Handler:           service.BodyReadDeadline(h, time.Duration(cp.APIBodyReadTimeoutSecs*float64(time.Second))),
		ReadHeaderTimeout: time.Duration(cfg.Server.ReadHeaderTimeoutSecs * float64(time.Second)),
		IdleTimeout:       time.Duration(cfg.Server.IdleTimeoutSecs * float64(time.Second)),
		MaxHeaderBytes:    cfg.Server.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetHTTP2(true)
	protos.SetUnencryptedHTTP2(true)
	api.Protocols = &protos
	// Data planes' Route streams never end on their own: a graceful
	// shutdown ends them rather than waiting out its deadline.
	api.RegisterOnShutdown(d.Core.CloseStreams)
	if cfg.Server.TLS.Enabled() {
		if api.TLSConfig, err = cfg.Server.TLS.ServerConfig(); err != nil {
			_ = node.Shutdown()
			if d.ownTracer {
				_ = d.Tracer.Close()
			}
			return nil, err
		}
	}
	d.API = api
	if !existing && !cp.Bootstrap && len(cp.Join) > 0 {
		// Joining adds a Raft voter: an admin operation, never one the
		// cluster token (which data planes hold) may perform.
		go d.join(ctx, client, adminToken)
	}
	if cp.Bootstrap {
		go d.seedWorkers(ctx)
	}
	// Every node bounds its own index (followers apply placements too).
	go d.Dec.Run(ctx, time.Duration(cfg.Cache.EvictionIntervalSecs*float64(time.Second)))
	return d, nil
}

// deciderOptions translates the config into the node's routing core: the
// same cache.* bounds and daily reset as the all-in-one mode, plus the
// leader's lease and ticket cap.
func deciderOptions(cfg *config.Config) decider.Options {
	return decider.Options{
		Policy:       decider.PolicyFrom(cfg),
		MaxEntries:   cfg.Cache.MaxTreeSize,
		InlineEvict:  cfg.Cache.EvictionIntervalSecs <= 0,
		PresizeIndex: true,
		DailyReset:   cfg.Cache.DailyCleanupHourUTC >= 0,
		ResetHourUTC: cfg.Cache.DailyCleanupHourUTC,
		LoadLease:    time.Duration(cfg.ControlPlane.LoadLeaseSecs * float64(time.Second)),
		MaxTickets:   cfg.ControlPlane.MaxUnsettledTickets,
		Flow:         decider.FlowFrom(cfg),
	}
}

// checkRaftAuth refuses a Raft port reachable beyond loopback with no peer
// authentication. Config validation says the same; this guards callers
// that build a Config in code, and sees the Raft token actually read.
func checkRaftAuth(cp config.ControlPlane, raftToken string, srvTLS *tls.Config) error {
	if raftToken != "" || (srvTLS != nil && srvTLS.ClientCAs != nil) || cp.AllowUnauthenticatedRaft {
		return nil
	}
	for _, a := range []string{cp.RaftAddr, cp.AdvertiseRaftAddr} {
		if a != "" && !config.LoopbackHostPort(a) {
			return fmt.Errorf("controlplane.raft_addr: %q is reachable beyond loopback but Raft peers are not authenticated; set auth.raft_token_file (peer handshake; the cluster token no longer authenticates Raft peers) or controlplane.raft_tls with client_ca_file, or controlplane.allow_unauthenticated_raft: true", a)
		}
	}
	return nil
}

// join asks the cluster (any listed node; followers forward to the
// leader) to add this node as a voter, retrying until it succeeds.
func (d *Daemon) join(ctx context.Context, client *http.Client, token string) {
	cp := d.cfg.ControlPlane
	req := &cartv1.AddVoterRequest{Id: cp.NodeID, RaftAddress: cp.EffectiveAdvertiseRaftAddr(), ApiUrl: cp.EffectiveAdvertiseAPIURL()}
	for attempt := 0; ; attempt++ {
		for _, u := range cp.Join {
			c := cartv1connect.NewAdminServiceClient(client, u, connect.WithGRPC(), connect.WithReadMaxBytes(cpclient.MaxAnswerBytes), connect.WithInterceptors(cpclient.Bearer(token)))
			actx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := c.AddVoter(actx, connect.NewRequest(req))
			cancel()
			if err == nil {
				d.log.Info("joined the cluster", "via", u)
				return
			}
			if attempt%10 == 0 {
				d.log.Warn("join failed; retrying", "via", u, "error", err.Error())
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// seedWorkers gives a freshly bootstrapped cluster the workers from the
// config, once: a cluster that already has a worker history keeps it.
func (d *Daemon) seedWorkers(ctx context.Context) {
	defer close(d.seeded)
	if len(d.cfg.Workers) == 0 {
		return
	}
	for ctx.Err() == nil {
		if d.Node.IsLeader() {
			if _, version := d.St.Workers(); version > 0 {
				return
			}
			cmd := &cartv1.SetWorkersCommand{}
			for _, w := range d.cfg.Workers {
				cmd.Workers = append(cmd.Workers, &cartv1.WorkerSpec{Url: w.URL, MaxLoad: uint32(w.MaxLoad), MaxConcurrency: uint32(w.MaxConcurrency), LoadPenalty: uint32(w.LoadPenalty), CacheCapacityTokens: w.CacheCapacityTokens, Source: state.SourceStatic, Role: w.Role})
			}
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := d.Node.Apply(actx, &cartv1.RaftCommand{RequestId: "seed-workers", Actor: "node " + d.cfg.ControlPlane.NodeID + " (workers from its config, first bootstrap)", Body: &cartv1.RaftCommand_SetWorkers{SetWorkers: cmd}})
			cancel()
			if err == nil {
				d.log.Info("seeded the worker set from the config", "workers", len(d.cfg.Workers))
				return
			}
			d.log.Warn("seed workers", "error", err.Error())
		} else if id, _ := d.Node.Leader(); id != "" && id != d.cfg.ControlPlane.NodeID {
			// Another node leads: the cluster existed before us. (Raft
			// names this node leader before its barrier completes, so
			// our own id means "not ready yet", not "someone else".)
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Serve runs the API on ln until ctx ends, then leaves gracefully: a
// leader first hands leadership over while its API still answers (so
// followers and data planes move to the new leader without a gap), then
// the API stops, then Raft.
func (d *Daemon) Serve(ctx context.Context, ln net.Listener) error {
	d.log.Info("cart control plane listening", "node", d.cfg.ControlPlane.NodeID, "api", ln.Addr().String(), "raft", d.cfg.ControlPlane.RaftAddr)
	errc := make(chan error, 1)
	go func() {
		if d.API.TLSConfig != nil {
			errc <- d.API.ServeTLS(ln, "", "")
		} else {
			// Plaintext h2c: buffer reads, which HTTP/2's frame reader
			// does not do on its own (see package bufconn).
			errc <- d.API.Serve(bufconn.Listener(ln, 0))
		}
	}()
	var err error
	select {
	case err = <-errc:
	case <-ctx.Done():
		if d.Node.IsLeader() {
			tctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			if _, terr := d.Node.TransferLeadership(tctx, ""); terr != nil {
				d.log.Warn("leadership transfer before shutdown", "error", terr.Error())
			}
			cancel()
		}
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if serr := d.API.Shutdown(sctx); serr != nil {
			_ = d.API.Close()
		}
		cancel()
		err = <-errc
	}
	if serr := d.Node.Shutdown(); serr != nil && (err == nil || errors.Is(err, http.ErrServerClosed)) {
		err = serr
	}
	d.Core.Close()
	if d.ownTracer {
		if terr := d.Tracer.Close(); terr != nil {
			d.log.Warn("tracing shutdown", "error", terr.Error())
		}
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// cpSink applies one source's discovery to the replicated worker set:
// every change is an idempotent Raft command (upsert, remove by URL) whose
// worker carries the source ("dns", "kubernetes"), so a new leader's
// watcher continues from the replicated set. Draining is leader soft state
// on the leader's engine.
type cpSink struct {
	d      *Daemon
	source string
}

func (s cpSink) Pool() map[string]string {
	ws, _ := s.d.St.Workers()
	out := make(map[string]string, len(ws))
	for _, w := range ws {
		out[w.URL] = w.Source
	}
	return out
}

func (s cpSink) Add(ctx context.Context, url, role string) error {
	maxLoad, penalty, capTokens := discovery.Defaults(s.d.cfg, s.source)
	spec := &cartv1.WorkerSpec{Url: url, MaxLoad: uint32(maxLoad), LoadPenalty: uint32(penalty),
		CacheCapacityTokens: capTokens, Source: s.source, Role: role}
	return s.apply(ctx, &cartv1.RaftCommand{RequestId: "discovery-" + s.source + "-add " + url,
		Body: &cartv1.RaftCommand_UpsertWorker{UpsertWorker: &cartv1.UpsertWorkerCommand{Worker: spec}}})
}

func (s cpSink) Remove(ctx context.Context, url string) error {
	if src, ok := s.Pool()[url]; !ok || src != s.source {
		return nil // gone already, or not ours
	}
	return s.apply(ctx, &cartv1.RaftCommand{RequestId: "discovery-" + s.source + "-remove " + url,
		Body: &cartv1.RaftCommand_RemoveWorker{RemoveWorker: &cartv1.RemoveWorkerCommand{Url: url}}})
}

func (s cpSink) apply(ctx context.Context, cmd *cartv1.RaftCommand) error {
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := s.d.Node.Apply(actx, cmd)
	return err
}

func (s cpSink) SetDraining(url string, on bool) { s.d.Dec.SetDraining(url, on) }

func (s cpSink) Load(url string) int { return s.d.Dec.Load(url) }
