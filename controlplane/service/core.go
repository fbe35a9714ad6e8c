package service

import (
	"context"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/cartrouter/cart/controlplane/affinity"
	"github.com/cartrouter/cart/controlplane/cpclient"
	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/health"
	"github.com/cartrouter/cart/controlplane/models"
	"github.com/cartrouter/cart/controlplane/raftnode"
	"github.com/cartrouter/cart/controlplane/state"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/every"
)

// Node is the Raft side the service needs (raftnode.Node implements it).
type Node interface {
	Apply(ctx context.Context, cmd *cartv1.RaftCommand) (state.Result, error)
	IsLeader() bool
	Leader() (id, raftAddr string)
	AddVoter(ctx context.Context, id, addr string) error
	RemoveServer(ctx context.Context, id string) error
	TransferLeadership(ctx context.Context, id string) (string, error)
	Status() raftnode.Status
}

// Options configure a Core.
type Options struct {
	NodeID     string
	APIURL     string // this node's advertised API URL
	BlockChars int
	// FlowOn: the leader queues requests for a saturated pool (flow.*), so
	// a dry run that finds it saturated says a live one would wait.
	FlowOn         bool
	PlacementBatch time.Duration
	PlacementMax   int
	Health         health.Config
	// DeclaredModels are models workers serve whatever their /v1/models
	// says (workers[].models), by worker URL.
	DeclaredModels map[string][]string
	// HealthClient probes workers; nil uses a default client.
	HealthClient *http.Client
	// Token and AdminToken are sent on RouterService and AdminService
	// calls forwarded to the leader. AdminToken has no fallback: the
	// cluster token is not an admin credential (see AuthOptions).
	Token      string
	AdminToken string
	Logger     *slog.Logger
	Now        func() time.Time
	// ForwardClient carries calls forwarded to the leader (h2c or TLS).
	ForwardClient *http.Client
	// LeaderLoops run while this node leads, stopped on losing leadership
	// (worker discovery: one watcher per cluster).
	LeaderLoops []func(ctx context.Context)
	// ResponseAffinityTTL and ResponseAffinityMax bound the leader's table
	// of Responses API response -> worker (responses.*; 0 = defaults).
	ResponseAffinityTTL time.Duration
	ResponseAffinityMax int
	// SlowLeader configures the slow-leader handover (handover.go).
	SlowLeader HandoverOptions
	// MaxSyncAnswerBytes is the largest Sync answer the leader sends: the
	// data planes' read limit (0 = cpclient.MaxAnswerBytes).
	MaxSyncAnswerBytes int
	// WorkerWritesAfter, when set, is closed once this node (bootstrapping
	// a new cluster) has seeded the worker set from its config or decided
	// not to. Admin worker writes wait for it: one applied first would make
	// the seed see a worker history and skip the config's workers.
	WorkerWritesAfter <-chan struct{}
}

// Core is one control-plane node's service state.
type Core struct {
	// streamTracer traces the Route calls a stream carries (set by
	// HandlerWith from its interceptors); nil: off.
	streamTracer cpclient.StreamTracer
	o            Options
	log          *slog.Logger
	dec          *decider.Decider // decisions, load, tickets; shared with the state machine
	// queuedCalls are Route calls waiting in the flow-control queue, so an
	// abandon report can end their wait (router.go).
	queuedCalls queuedCalls
	st          *state.State
	node        Node

	// models are the workers' model lists the leader's prober learned.
	models *models.Registry
	// responses is leader soft state with its own lock (see package
	// affinity): which worker produced each stored response.
	responses *affinity.Table[uint64]

	batch    *batcher
	fwd      *forwarder
	metrics  *cpMetrics
	handover *handover // nil when the slow-leader handover is off
	streams  streamScope
	// placements feeds data planes' shadow indexes (placementfeed.go).
	placements *placementFeed

	// syncWarned limits the Sync answer size log to a line per 10 s.
	syncWarned every.Gate

	ready      chan struct{} // closed by SetNode; leadership waits for it
	lifeMu     sync.Mutex    // serialises leadership transitions
	stopLeader context.CancelFunc
	leaderDone chan struct{}
}

// New builds a Core over the node's decider and the state machine built on
// it. Call SetNode before serving and wire OnLeadership into the Raft node.
func New(o Options, dec *decider.Decider, st *state.State) *Core {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MaxSyncAnswerBytes <= 0 {
		o.MaxSyncAnswerBytes = cpclient.MaxAnswerBytes
	}
	c := &Core{o: o, log: o.Logger, dec: dec, st: st, models: models.New(), placements: newPlacementFeed(feedRing)}
	c.fwd = newForwarder(o.ForwardClient, o.Token, o.AdminToken, cpclient.MaxAnswerBytes)
	c.responses = affinity.New[uint64](o.ResponseAffinityTTL, o.ResponseAffinityMax)
	st.SetResponseOrigins(originTable{c.responses, c.o.Now})
	c.ready = make(chan struct{})
	c.streams.init()
	// The batcher and the state's own-batch check exist before the Raft
	// node starts applying entries; SetNode only supplies the node.
	c.batch = newBatcher(nil, o.PlacementBatch, o.PlacementMax, c.log, dec)
	c.st.SetOwnBatches(c.batch)
	dec.SetLedger(c.batch)
	c.metrics = newCPMetrics(c)
	if o.SlowLeader.Enabled {
		c.handover = newHandover(c, o.SlowLeader)
		c.o.LeaderLoops = append(slices.Clip(c.o.LeaderLoops), c.handover.run)
	}
	return c
}

// SetNode attaches the Raft node (it is created after the Core because the
// node's leadership callback needs the Core).
func (c *Core) SetNode(n Node) {
	c.node = n
	c.batch.node = n
	close(c.ready)
}

// OnLeadership is the Raft node's leadership callback: gaining leadership
// (after the barrier) starts the leader's loops from clean soft state;
// losing it stops them.
func (c *Core) OnLeadership(leader bool) {
	if leader {
		<-c.ready // raft may elect us before the daemon wired the node in
	}
	c.lifeMu.Lock()
	defer c.lifeMu.Unlock()
	if c.stopLeader != nil {
		c.stopLeader()
		<-c.leaderDone
		c.stopLeader = nil
	}
	// Load, health and tickets are soft state: a new term starts clean.
	c.dec.Lead(leader)
	// Streams opened in the old term end, so their data planes reconnect
	// to whoever leads now.
	c.streams.leading(leader)
	if !leader {
		c.log.Info("control plane: follower", "node", c.o.NodeID)
		return
	}
	c.log.Info("control plane: leader", "node", c.o.NodeID)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	c.stopLeader, c.leaderDone = cancel, done
	go func() {
		defer close(done)
		c.runLeader(ctx)
	}()
}

// Close stops the leader loops, if running.
func (c *Core) Close() {
	c.OnLeadership(false)
}

func (c *Core) runLeader(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(3 + len(c.o.LeaderLoops))
	go func() { defer wg.Done(); c.batch.run(ctx) }()
	go func() { defer wg.Done(); c.sweep(ctx) }()
	go func() { defer wg.Done(); c.probe(ctx) }()
	for _, loop := range c.o.LeaderLoops {
		go func() { defer wg.Done(); loop(ctx) }()
	}
	c.ensureMember(ctx)
	wg.Wait()
	// A decision that raced the step-down may have queued a placement
	// after the final flush: undo it rather than keep it for a later term.
	c.batch.discard()
}

// ensureMember publishes this node's API URL in the replicated directory
// so followers can point clients at it.
func (c *Core) ensureMember(ctx context.Context) {
	cmd := &cartv1.RaftCommand{Actor: "node " + c.o.NodeID + " (publishing its own API URL as leader)", Body: &cartv1.RaftCommand_SetMember{SetMember: &cartv1.SetMemberCommand{NodeId: c.o.NodeID, ApiUrl: c.o.APIURL}}}
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		if c.o.APIURL == "" || c.st.Members()[c.o.NodeID] == c.o.APIURL {
			return
		}
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.node.Apply(actx, cmd)
		cancel()
		if err == nil {
			return
		}
		// Without the URL followers cannot forward to us: keep trying.
		c.log.Warn("publish API URL", "error", err.Error())
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// sweep drops data planes whose syncs stopped (their load leaves the view
// after the lease) and decisions never settled.
func (c *Core) sweep(ctx context.Context) {
	every.Tick(ctx, max(c.dec.LoadLease()/4, 50*time.Millisecond), nil, func() {
		for _, id := range c.dec.Sweep() {
			c.log.Warn("data plane lease expired: its load left the view", "dataplane", id)
		}
	})
}

// probe runs the pool's health checks on the leader only: one prober per
// pool, not one per proxy; data planes learn the verdicts through Sync.
func (c *Core) probe(ctx context.Context) {
	hc := c.o.Health
	hc.ModelsEndpoint = models.Path
	hc.Models = models.Learner(c.models, c.log)
	chk := health.NewChecker(hc, c.o.HealthClient, func(w string, healthy bool, reason string) {
		c.dec.SetHealthy(w, healthy)
		c.log.Warn("worker health changed", "worker", w, "healthy", healthy, "reason", reason)
	})
	t := time.NewTicker(c.o.Health.Interval)
	defer t.Stop()
	// The worker set changes between rounds (cartctl, discovery): a worker
	// added is routable at once, but model routing treats it as serving
	// nothing it is not yet known to serve, so its models are read as soon
	// as it shows up rather than at the next round.
	setTick := time.NewTicker(workerSetPoll)
	defer setTick.Stop()
	var applied []string
	first := true
	apply := func() {
		ws, _ := c.st.Workers()
		urls := make([]string, len(ws))
		mws := make([]models.Worker, len(ws))
		for i, w := range ws {
			urls[i] = w.URL
			mws[i] = models.Worker{URL: w.URL, Declared: c.o.DeclaredModels[w.URL]}
		}
		if !first && slices.Equal(urls, applied) {
			return
		}
		first = false
		// The registry first: a models answer for a worker it does not
		// know yet would be dropped.
		c.models.SetWorkers(mws)
		chk.SetWorkers(urls)
		applied = urls
	}
	for {
		apply()
		chk.Round(ctx)
	wait:
		for {
			select {
			case <-ctx.Done():
				return
			case <-setTick.C:
				apply()
				chk.ReadFresh(ctx)
			case <-t.C:
				break wait
			}
		}
	}
}

// workerSetPoll is how often the leader's prober looks for workers added
// since its last round.
const workerSetPoll = 250 * time.Millisecond

// originTable is the state machine's view of the Responses API origins
// table: learned from other nodes' place batches, kept in snapshots.
type originTable struct {
	t   *affinity.Table[uint64]
	now func() time.Time
}

func (o originTable) Learn(origins []*cartv1.ResponseOrigin) {
	now := o.now()
	for _, r := range origins {
		o.t.Learn(r.GetIdHash(), affinity.Origin{Worker: r.GetWorker(), Tenant: r.GetTenantHash()}, now)
	}
}

func (o originTable) Stored() []*cartv1.StoredOrigin {
	es := o.t.Entries(o.now())
	out := make([]*cartv1.StoredOrigin, len(es))
	for i, e := range es {
		out[i] = &cartv1.StoredOrigin{IdHash: e.Key, Worker: e.Worker, TenantHash: e.Tenant, ExpiresUnixNanos: e.Expires.UnixNano()}
	}
	return out
}

func (o originTable) Restore(stored []*cartv1.StoredOrigin) {
	es := make([]affinity.Entry[uint64], len(stored))
	for i, r := range stored {
		es[i] = affinity.Entry[uint64]{Key: r.GetIdHash(), Origin: affinity.Origin{Worker: r.GetWorker(), Tenant: r.GetTenantHash()}, Expires: time.Unix(0, r.GetExpiresUnixNanos())}
	}
	o.t.Merge(es, o.now())
}
