package raftnode

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/cartrouter/cart/controlplane/state"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// Defaults for Config fields left zero.
const (
	// DefaultSnapshotThreshold is how many entries since the last snapshot
	// trigger a new one. Snapshots are what let raft truncate the log, and
	// placements are a steady stream of entries, so this must be reached.
	DefaultSnapshotThreshold = 8192
	// DefaultTrailingLogs is how many entries stay in the log after a
	// snapshot, so a briefly lagging follower catches up from the log
	// rather than by receiving the whole index. The WAL deletes whole
	// segments once truncation passes them; bolt reuses the pages that
	// truncation frees but never shrinks raft.db, so the file settles at
	// about TrailingLogs plus SnapshotThreshold entries.
	DefaultTrailingLogs = 10240

	defaultApplyTimeout = 5 * time.Second
	// shutdownTransferTimeout bounds the leadership hand-off on Shutdown;
	// raft itself gives up after about two election timeouts.
	shutdownTransferTimeout = 3 * time.Second
	// barrierTimeout is how long the post-election barrier may wait to be
	// enqueued; it is retried while this node stays leader.
	barrierTimeout = 10 * time.Second

	snapshotsRetained = 2
	logCacheEntries   = 512
	netMaxPool        = 3
	netTimeout        = 10 * time.Second
	boltOpenTimeout   = time.Second
	raftDBFile        = "raft.db"
	snapshotsDir      = "snapshots"
)

// ErrNotLeader is returned by Apply, AddVoter, RemoveServer and
// TransferLeadership on a node that is not the leader or that lost
// leadership during the call. The wrapped message names the leader if one
// is known and says whether a write may have landed.
var ErrNotLeader = errors.New("not the raft leader")

// ErrOutcomeUnknown (wrapped, possibly together with ErrNotLeader) means
// the entry was handed to raft but its fate is not known: the leader lost
// leadership or the caller stopped waiting after it was appended, and a
// majority may already hold it, in which case it commits later. Callers
// must report this apart from a definite failure.
var ErrOutcomeUnknown = errors.New("outcome unknown: it may or may not have been committed")

// Config configures a Node.
type Config struct {
	NodeID        string
	BindAddr      string // raft listen address host:port (TCP)
	AdvertiseAddr string // what peers dial; "" = the bound address
	// DataDir holds the log and stable store (wal/ or raft.db, see
	// LogStore) and snapshots/. It is created with mode 0700 and locked
	// while the node runs.
	DataDir string
	// LogStore picks the log for a data directory that has none yet:
	// LogStoreWAL (also for "" and LogStoreAuto) or LogStoreBolt. A
	// directory that holds a log keeps it; asking for the other kind is
	// an error.
	LogStore string
	// Bootstrap makes this node bootstrap a single-voter cluster when it has
	// no existing state; other nodes then join through AddVoter.
	Bootstrap bool
	// ServerTLS secures the raft listener (nil = plain TCP). With ClientCAs
	// set, peers must present a client certificate signed by them.
	ServerTLS *tls.Config
	// ClientTLS is used when dialing peers (nil = plain TCP).
	ClientTLS *tls.Config
	// RaftToken, when set, turns on the peer handshake: every Raft
	// connection, in both directions, must prove knowledge of it before
	// its first RPC. Every member needs the same token, and nothing but
	// control-plane nodes may hold it (data planes hold the cluster token,
	// which therefore must open nothing here).
	RaftToken string
	// LegacyToken is the cluster token, for a rolling upgrade from releases
	// that keyed the handshake with it: the node then also accepts that
	// handshake (v1), and uses it towards peers that refuse the Raft
	// token's. Alone (without RaftToken) it makes a node of such a release.
	LegacyToken string
	// HandshakeTimeout bounds the TLS and peer handshakes of one
	// connection (default 5 s).
	HandshakeTimeout time.Duration
	// MaxInboundConns caps the inbound Raft connections held at once,
	// authenticating or authenticated (default 256).
	MaxInboundConns int

	SnapshotThreshold uint64 // default DefaultSnapshotThreshold
	TrailingLogs      uint64 // default DefaultTrailingLogs

	Logger *slog.Logger
	// Fatal is called when a committed entry cannot be applied: the node
	// must stop rather than diverge from its peers. Default: log and exit 1.
	Fatal func(error)

	// Test hooks. With Transport set, the node uses it instead of TCP, and
	// in-memory stores unless Stores is set. Stores also replaces the bolt
	// and file stores on its own.
	Transport raft.Transport
	Stores    *Stores
	Timeouts  *Timeouts
}

// Stores are replacements for the on-disk stores (tests).
type Stores struct {
	Log    raft.LogStore
	Stable raft.StableStore
	Snap   raft.SnapshotStore
}

// Timeouts override raft's timing (tests use tens of milliseconds so that
// elections are quick). Zero fields keep raft's defaults.
type Timeouts struct {
	Heartbeat, Election, LeaderLease, Commit time.Duration
}

// Status is a point-in-time view of the node, for the admin API.
type Status struct {
	NodeID       string
	State        string // follower, candidate, leader, shutdown
	LeaderID     string
	LeaderAddr   string
	Term         uint64
	CommitIndex  uint64
	AppliedIndex uint64
	LastLogIndex uint64
	Members      []Member
}

// Member is one server of the Raft configuration.
type Member struct {
	ID, Addr string
	Suffrage string // voter, nonvoter, staging
}

// Node is a running Raft node over a state machine.
type Node struct {
	cfg   Config
	log   *slog.Logger
	raft  *raft.Raft
	fsm   *fsm
	trans raft.Transport
	disk  *diskStores // nil with test stores

	notifyCh chan bool
	// readyTerm is the term in which this node became leader and finished
	// its barrier; 0 when not leading. Comparing it with the current term
	// keeps IsLeader false in a later term whose barrier has not run yet.
	readyTerm atomic.Uint64

	stopCh    chan struct{}
	watchDone chan struct{}
	// leaders feeds watchLeaders; leadersDone closes when it returns.
	leaders     chan raft.Observation
	observer    *raft.Observer
	leadersDone chan struct{}
	// followers tracks, on the leader, which peers miss heartbeats.
	followers followerHealth

	shutdownOnce sync.Once
	shutdownErr  error
}

// Start opens the stores, starts raft, bootstraps if asked and there is no
// existing state, and starts watching leadership. onLeadership(true) is
// called only after a successful barrier on gaining leadership,
// onLeadership(false) when it is lost or the node shuts down; calls come
// from one goroutine, in order. onLeadership may be nil; it must not call
// Shutdown (which waits for that goroutine).
func Start(cfg Config, st *state.State, onLeadership func(leader bool)) (*Node, error) {
	if cfg.NodeID == "" {
		return nil, errors.New("raftnode: NodeID is required")
	}
	if st == nil {
		return nil, errors.New("raftnode: state is required")
	}
	if cfg.SnapshotThreshold == 0 {
		cfg.SnapshotThreshold = DefaultSnapshotThreshold
	}
	if cfg.TrailingLogs == 0 {
		cfg.TrailingLogs = DefaultTrailingLogs
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	logger := cfg.Logger.With("node", cfg.NodeID)
	if cfg.Fatal == nil {
		cfg.Fatal = func(err error) {
			logger.Error("raft: cannot apply a committed entry; stopping so this node does not diverge", "error", err.Error())
			os.Exit(1)
		}
	}
	hlog := newHCLogAdapter(logger, "raft")
	// Every node logs every change it applies, so the audit trail
	// survives the loss of whichever node took the admin call.
	st.SetAuditLog(logger)

	n := &Node{
		cfg:       cfg,
		log:       logger,
		fsm:       &fsm{st: st, fatal: cfg.Fatal, audit: logger},
		notifyCh:  make(chan bool, 16),
		stopCh:    make(chan struct{}),
		watchDone: make(chan struct{}),
	}

	logs, stable, snaps, err := n.openStores(hlog)
	if err != nil {
		return nil, err
	}
	trans := cfg.Transport
	if trans == nil {
		if cfg.BindAddr == "" {
			_ = n.closeStores()
			return nil, errors.New("raftnode: BindAddr is required without a test Transport")
		}
		opts := streamOptions{handshakeTimeout: cfg.HandshakeTimeout, maxInbound: cfg.MaxInboundConns, log: logger}
		if cfg.RaftToken != "" || cfg.LegacyToken != "" {
			if opts.auth, err = newPeerAuth(cfg.NodeID, cfg.RaftToken, cfg.LegacyToken); err != nil {
				_ = n.closeStores()
				return nil, err
			}
		}
		stream, err := newStreamLayer(cfg.BindAddr, cfg.AdvertiseAddr, cfg.ServerTLS, cfg.ClientTLS, opts)
		if err != nil {
			_ = n.closeStores()
			return nil, err
		}
		trans = raft.NewNetworkTransportWithLogger(stream, netMaxPool, netTimeout, hlog.Named("net"))
	}
	// From here on, a failure must release the transport too: a network
	// transport has a listener and an accept goroutine.
	fail := func(err error) (*Node, error) {
		if c, ok := trans.(raft.WithClose); ok && cfg.Transport == nil {
			_ = c.Close()
		}
		_ = n.closeStores()
		return nil, err
	}

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.Logger = hlog
	rc.NotifyCh = n.notifyCh
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.TrailingLogs = cfg.TrailingLogs
	if t := cfg.Timeouts; t != nil {
		setIf(&rc.HeartbeatTimeout, t.Heartbeat)
		setIf(&rc.ElectionTimeout, t.Election)
		setIf(&rc.LeaderLeaseTimeout, t.LeaderLease)
		setIf(&rc.CommitTimeout, t.Commit)
	}
	if err := raft.ValidateConfig(rc); err != nil {
		return fail(fmt.Errorf("raftnode: invalid raft config: %w", err))
	}

	existing, err := raft.HasExistingState(logs, stable, snaps)
	if err != nil {
		return fail(fmt.Errorf("raftnode: check existing state: %w", err))
	}
	r, err := raft.NewRaft(rc, n.fsm, logs, stable, snaps, trans)
	if err != nil {
		return fail(fmt.Errorf("raftnode: start raft: %w", err))
	}
	n.raft, n.trans = r, trans

	if cfg.Bootstrap && !existing {
		boot := raft.Configuration{Servers: []raft.Server{{
			Suffrage: raft.Voter,
			ID:       rc.LocalID,
			Address:  trans.LocalAddr(),
		}}}
		switch err := r.BootstrapCluster(boot).Error(); {
		case err == nil:
			logger.Info("raft: bootstrapped a single-voter cluster", "addr", string(trans.LocalAddr()))
		case errors.Is(err, raft.ErrCantBootstrap):
			// State appeared between the check and the bootstrap: nothing
			// to do, the node rejoins its cluster.
		default:
			_ = r.Shutdown().Error()
			_ = n.closeStores()
			return nil, fmt.Errorf("raftnode: bootstrap: %w", err)
		}
	}

	n.leaders = make(chan raft.Observation, 64)
	n.leadersDone = make(chan struct{})
	n.observer = raft.NewObserver(n.leaders, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.LeaderObservation, raft.FailedHeartbeatObservation, raft.ResumedHeartbeatObservation:
			return true
		}
		return false
	})
	r.RegisterObserver(n.observer)
	go n.watchLeaders()
	go n.watchLeadership(onLeadership)
	return n, nil
}

// watchLeaders writes every change of leader this node observes to the
// audit log, so each node's log shows who led when, whatever caused it.
func (n *Node) watchLeaders() {
	defer close(n.leadersDone)
	prev := "(none)"
	for {
		select {
		case <-n.stopCh:
			return
		case o := <-n.leaders:
			if n.followers.observe(o.Data) {
				continue
			}
			lo, _ := o.Data.(raft.LeaderObservation)
			now := "(none)"
			if lo.LeaderID != "" {
				now = fmt.Sprintf("%s@%s", lo.LeaderID, lo.LeaderAddr)
			}
			if now == prev {
				continue
			}
			n.log.Info("audit: raft leader changed", "audit", true, "term", n.raft.CurrentTerm(), "old", prev, "new", now)
			prev = now
		}
	}
}

func setIf(dst *time.Duration, v time.Duration) {
	if v > 0 {
		*dst = v
	}
}

// openStores returns the test stores, in-memory ones for a test transport,
// or the data directory's log (behind a log cache) and file snapshots.
func (n *Node) openStores(hlog *hclogAdapter) (raft.LogStore, raft.StableStore, raft.SnapshotStore, error) {
	cfg := n.cfg
	switch {
	case cfg.Stores != nil:
		s := cfg.Stores
		if s.Log == nil || s.Stable == nil || s.Snap == nil {
			return nil, nil, nil, errors.New("raftnode: Stores needs Log, Stable and Snap")
		}
		return s.Log, s.Stable, s.Snap, nil
	case cfg.Transport != nil:
		mem := raft.NewInmemStore()
		return mem, mem, raft.NewInmemSnapshotStore(), nil
	}
	if cfg.DataDir == "" {
		return nil, nil, nil, errors.New("raftnode: DataDir is required without a test Transport or Stores")
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, nil, nil, fmt.Errorf("raftnode: create data dir: %w", err)
	}
	disk, err := openDisk(cfg.DataDir, cfg.LogStore, hlog)
	if err != nil {
		return nil, nil, nil, err
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, snapshotsRetained, hlog.Named("snapshots"))
	if err != nil {
		_ = disk.Close()
		return nil, nil, nil, fmt.Errorf("raftnode: open snapshot store in %s: %w", cfg.DataDir, err)
	}
	store, stable := disk.store()
	logs, err := raft.NewLogCache(logCacheEntries, store)
	if err != nil {
		_ = disk.Close()
		return nil, nil, nil, fmt.Errorf("raftnode: log cache: %w", err)
	}
	n.disk = disk
	return logs, stable, snaps, nil
}

func (n *Node) closeStores() error {
	return n.disk.Close()
}

// HasExistingState reports whether dataDir holds Raft state (a term, log
// entries or a snapshot), i.e. whether a node started there would rejoin
// its cluster rather than need bootstrapping or joining. It must not be
// called while a node runs on dataDir (it fails on the data dir lock).
func HasExistingState(dataDir string) (bool, error) {
	hasBolt, hasWAL, err := logsIn(dataDir)
	if err != nil {
		return false, err
	}
	if hasBolt || hasWAL {
		hlog := newHCLogAdapter(slog.Default(), "raft")
		disk, err := openDisk(dataDir, LogStoreAuto, hlog)
		if err != nil {
			return false, err
		}
		defer disk.Close()
		snaps, err := raft.NewFileSnapshotStoreWithLogger(dataDir, snapshotsRetained, hlog.Named("snapshots"))
		if err != nil {
			return false, fmt.Errorf("raftnode: open snapshot store in %s: %w", dataDir, err)
		}
		logs, stable := disk.store()
		ok, err := raft.HasExistingState(logs, stable, snaps)
		if err != nil {
			return false, fmt.Errorf("raftnode: check existing state in %s: %w", dataDir, err)
		}
		return ok, nil
	}
	// No log: snapshots alone still mean state (the log may have been lost,
	// and raft would restore from them).
	entries, err := os.ReadDir(filepath.Join(dataDir, snapshotsDir))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("raftnode: list snapshots in %s: %w", dataDir, err)
	}
	return len(entries) > 0, nil
}

// watchLeadership turns raft's leadership notifications into onLeadership
// calls. Gaining leadership counts only after a barrier: the new leader may
// still have committed entries of earlier terms to apply, and its services
// must not act on a state that is behind what clients were already told.
func (n *Node) watchLeadership(onLeadership func(bool)) {
	defer close(n.watchDone)
	leading := false
	set := func(v bool) {
		if v == leading {
			return
		}
		leading = v
		if !v {
			n.readyTerm.Store(0)
			n.log.Info("raft: leadership lost")
		}
		if onLeadership != nil {
			onLeadership(v)
		}
	}
	// On shutdown the leader's services must stop too.
	defer set(false)
	for {
		select {
		case <-n.stopCh:
			return
		case isLeader := <-n.notifyCh:
			if !isLeader {
				set(false)
				continue
			}
			term, ok := n.barrier()
			if !ok {
				continue // lost it again already; its "false" is queued
			}
			n.readyTerm.Store(term)
			n.log.Info("raft: leader and up to date", "term", term)
			set(true)
		}
	}
}

// barrier waits until everything committed before this term is applied,
// and returns the term it did so in. It gives up when leadership goes.
func (n *Node) barrier() (uint64, bool) {
	backoff := 10 * time.Millisecond
	for {
		term := n.raft.CurrentTerm()
		if n.raft.State() != raft.Leader {
			return 0, false
		}
		err := n.await(context.Background(), n.raft.Barrier(barrierTimeout))
		if err == nil {
			// The barrier committed in term only if we are still its leader.
			if n.raft.State() == raft.Leader && n.raft.CurrentTerm() == term {
				return term, true
			}
			return 0, false
		}
		if errors.Is(err, raft.ErrLeadershipLost) || errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrRaftShutdown) {
			return 0, false
		}
		n.log.Warn("raft: post-election barrier failed; retrying", "error", err.Error())
		select {
		case <-n.stopCh:
			return 0, false
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// Apply proposes cmd and waits until it is applied on this node (the
// leader). The context bounds the whole call (default 5 s). ErrNotLeader
// (wrapped) means this node could not commit it; the message says whether
// the entry may still have landed. Commands are idempotent, so a caller
// can retry on the current leader either way.
func (n *Node) Apply(ctx context.Context, cmd *cartv1.RaftCommand) (state.Result, error) {
	data, err := state.Encode(cmd)
	if err != nil {
		return state.Result{}, fmt.Errorf("raft apply: %w", err)
	}
	ctx, cancel := withDefaultTimeout(ctx, defaultApplyTimeout)
	defer cancel()
	enqueue, err := remaining(ctx)
	if err != nil {
		return state.Result{}, fmt.Errorf("raft apply: not proposed: %w", err)
	}
	f := n.raft.Apply(data, enqueue)
	if err := n.await(ctx, f); err != nil {
		return state.Result{}, n.mapAwaitErr("raft apply", f, err)
	}
	switch resp := f.Response().(type) {
	case state.Result:
		return resp, nil
	case error:
		// The entry committed but this node could not apply it (and Fatal
		// was called): the caller must not treat the write as done.
		return state.Result{}, fmt.Errorf("raft apply: committed at index %d but not applied: %w", f.Index(), resp)
	default:
		return state.Result{}, fmt.Errorf("raft apply: unexpected response %T at index %d", resp, f.Index())
	}
}

// errCtx marks an await that ended because the caller's context did,
// while the operation may still go on inside raft.
type errCtx struct{ err error }

func (e errCtx) Error() string { return e.err.Error() }
func (e errCtx) Unwrap() error { return e.err }

// await waits for f or ctx. raft futures cannot be cancelled, so on ctx
// the waiting goroutine stays until raft resolves the future or the node
// stops (releaseAtStop).
func (n *Node) await(ctx context.Context, f raft.Future) error {
	releaseAtStop(f, n.stopCh)
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return errCtx{ctx.Err()}
	}
}

// releaseAtStop makes f.Error return raft.ErrRaftShutdown once stop is
// closed. raft never answers an Apply or Barrier future whose committed
// entry is still queued for the FSM when it shuts down
// (hashicorp/raft#498): without this, a waiter on such a future blocks for
// good. raft's futures carry an exported ShutdownCh for this, which raft
// itself sets only on some kinds; it is reached by reflection because the
// future types are unexported. stop must close only after raft's shutdown
// has returned, so a released waiter reads the future's other fields
// (Index) after raft's goroutines last wrote them. Reports whether f could
// be released (TestEveryFutureKindCanBeReleased pins that for the kinds
// CART waits on, so a raft upgrade that drops the field fails a test, not
// a shutdown).
func releaseAtStop(f raft.Future, stop chan struct{}) bool {
	v := reflect.ValueOf(f)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return false // raft's errorFuture: already answered
	}
	fld := v.Elem().FieldByName("ShutdownCh")
	if !fld.IsValid() || !fld.CanSet() || fld.Type() != reflect.TypeOf(stop) {
		return false
	}
	if fld.IsNil() { // keep raft's own channel where it set one
		fld.Set(reflect.ValueOf(stop))
	}
	return true
}

// mapAwaitErr is mapApplyErr for an error from awaiting f: raft's
// shutdown error for an entry already appended (f.Index() set) means a
// majority may hold it, not that it was never appended. f.Index() is read
// only when f.Error() itself returned (never after a context ended, while
// raft may still write it).
func (n *Node) mapAwaitErr(op string, f raft.IndexFuture, err error) error {
	if errors.Is(err, raft.ErrRaftShutdown) && f.Index() != 0 {
		return n.notLeader(op, "retry on the leader", fmt.Errorf("%w: %w", ErrOutcomeUnknown, err))
	}
	return n.mapApplyErr(op, err)
}

// mapApplyErr turns raft's errors into the package's, saying whether the
// entry may have been committed: the caller decides whether to retry.
func (n *Node) mapApplyErr(op string, err error) error {
	var ce errCtx
	switch {
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress), errors.Is(err, raft.ErrRaftShutdown):
		return n.notLeader(op, "it was not appended", err)
	case errors.Is(err, raft.ErrLeadershipLost):
		return n.notLeader(op, "retry on the leader", fmt.Errorf("%w: %w", ErrOutcomeUnknown, err))
	case errors.Is(err, raft.ErrEnqueueTimeout):
		return fmt.Errorf("%s: leader too busy, not appended: %w", op, err)
	case errors.As(err, &ce):
		if n.raft.State() != raft.Leader {
			return n.notLeader(op, "retry on the leader", fmt.Errorf("%w: %w", ErrOutcomeUnknown, err))
		}
		return fmt.Errorf("%s: gave up waiting: %w: %w", op, ErrOutcomeUnknown, err)
	default:
		return fmt.Errorf("%s: %w", op, err)
	}
}

func (n *Node) notLeader(op, outcome string, cause error) error {
	id, addr := n.Leader()
	leader := "unknown"
	if id != "" {
		leader = fmt.Sprintf("%s at %s", id, addr)
	}
	return fmt.Errorf("%s on %s: %w (leader: %s); %s: %w", op, n.cfg.NodeID, ErrNotLeader, leader, outcome, cause)
}

func withDefaultTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// remaining is the time left in ctx, used as raft's enqueue timeout.
func remaining(ctx context.Context) (time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	dl, _ := ctx.Deadline()
	d := time.Until(dl)
	if d <= 0 {
		return 0, context.DeadlineExceeded
	}
	return d, nil
}

// IsLeader is true only while raft says this node leads and the barrier of
// its current term has completed.
func (n *Node) IsLeader() bool {
	ready := n.readyTerm.Load()
	if ready == 0 {
		return false
	}
	// A node leads at most once per term, so leader state read between two
	// equal term reads is the leadership of that term.
	t1 := n.raft.CurrentTerm()
	st := n.raft.State()
	t2 := n.raft.CurrentTerm()
	return st == raft.Leader && t1 == ready && t2 == ready
}

// Leader returns the current leader's id and raft address ("" if unknown).
func (n *Node) Leader() (id string, raftAddr string) {
	addr, sid := n.raft.LeaderWithID()
	return string(sid), string(addr)
}

func (n *Node) servers() ([]raft.Server, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, fmt.Errorf("read raft configuration: %w", err)
	}
	return f.Configuration().Servers, nil
}

// changeMembership proposes the configuration change start makes, given
// the time left to enqueue it, and waits for its commit (default 5 s);
// what names the change in errors.
func (n *Node) changeMembership(ctx context.Context, what string, start func(enqueue time.Duration) raft.IndexFuture) error {
	ctx, cancel := withDefaultTimeout(ctx, defaultApplyTimeout)
	defer cancel()
	enqueue, err := remaining(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	f := start(enqueue)
	if err := n.await(ctx, f); err != nil {
		return n.mapAwaitErr(what, f, err)
	}
	return nil
}

// AddVoter adds (or re-addresses) a voting member. A server that already
// is a voter at addr is success, so a joining node can simply retry.
func (n *Node) AddVoter(ctx context.Context, id, addr string) error {
	if id == "" || addr == "" {
		return errors.New("add voter: id and address are required")
	}
	if n.raft.State() != raft.Leader {
		return n.notLeader("add voter "+id, "nothing changed", raft.ErrNotLeader)
	}
	servers, err := n.servers()
	if err != nil {
		return fmt.Errorf("add voter %s: %w", id, err)
	}
	for _, s := range servers {
		if string(s.ID) == id && string(s.Address) == addr && s.Suffrage == raft.Voter {
			return nil
		}
	}
	if err := n.changeMembership(ctx, "add voter "+id, func(enqueue time.Duration) raft.IndexFuture {
		return n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, enqueue)
	}); err != nil {
		return err
	}
	n.log.Info("raft: voter added", "id", id, "addr", addr)
	return nil
}

// RemoveServer removes a member. Removing a server that is not a member is
// success (idempotent, like AddVoter).
func (n *Node) RemoveServer(ctx context.Context, id string) error {
	if n.raft.State() != raft.Leader {
		return n.notLeader("remove server "+id, "nothing changed", raft.ErrNotLeader)
	}
	servers, err := n.servers()
	if err != nil {
		return fmt.Errorf("remove server %s: %w", id, err)
	}
	found := false
	for _, s := range servers {
		found = found || string(s.ID) == id
	}
	if !found {
		return nil
	}
	if err := n.changeMembership(ctx, "remove server "+id, func(enqueue time.Duration) raft.IndexFuture {
		return n.raft.RemoveServer(raft.ServerID(id), 0, enqueue)
	}); err != nil {
		return err
	}
	n.log.Info("raft: server removed", "id", id)
	return nil
}

// TransferLeadership hands leadership to id ("" = the most up-to-date
// voter) and waits until some other node is known as leader, bounded by
// ctx. It returns that node's id, which may differ from id if another
// voter won the election. Transferring to this node itself is a no-op that
// returns its id.
func (n *Node) TransferLeadership(ctx context.Context, id string) (string, error) {
	if n.raft.State() != raft.Leader {
		return "", n.notLeader("transfer leadership", "nothing changed", raft.ErrNotLeader)
	}
	if id == n.cfg.NodeID {
		return n.cfg.NodeID, nil
	}
	var f raft.Future
	if id == "" {
		f = n.raft.LeadershipTransfer()
	} else {
		servers, err := n.servers()
		if err != nil {
			return "", fmt.Errorf("transfer leadership to %s: %w", id, err)
		}
		var addr raft.ServerAddress
		for _, s := range servers {
			if string(s.ID) == id && s.Suffrage == raft.Voter {
				addr = s.Address
			}
		}
		if addr == "" {
			return "", fmt.Errorf("transfer leadership: %q is not a voter", id)
		}
		f = n.raft.LeadershipTransferToServer(raft.ServerID(id), addr)
	}
	if err := n.await(ctx, f); err != nil {
		if errors.Is(err, raft.ErrNotLeader) {
			return "", n.notLeader("transfer leadership", "nothing changed", err)
		}
		return "", fmt.Errorf("transfer leadership: %w", err)
	}
	// The transfer future resolves when this node steps down; the new
	// leader is known here once its first heartbeat arrives.
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		if leader, _ := n.Leader(); leader != "" && leader != n.cfg.NodeID {
			return leader, nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("transfer leadership: stepped down but no new leader seen yet: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// Status reports the node's raft view.
func (n *Node) Status() Status {
	id, addr := n.Leader()
	s := Status{
		NodeID:       n.cfg.NodeID,
		State:        strings.ToLower(n.raft.State().String()),
		LeaderID:     id,
		LeaderAddr:   addr,
		Term:         n.raft.CurrentTerm(),
		CommitIndex:  n.raft.CommitIndex(),
		AppliedIndex: n.raft.AppliedIndex(),
		LastLogIndex: n.raft.LastIndex(),
	}
	select {
	case <-n.stopCh:
		// raft can leave its state at "follower" when Shutdown races with
		// a step-down (a leadership transfer just before it); a stopped
		// node is stopped whatever raft last wrote.
		s.State = "shutdown"
	default:
	}
	// After shutdown the configuration is unavailable; the rest still
	// describes the node's last view.
	if servers, err := n.servers(); err == nil {
		for _, srv := range servers {
			s.Members = append(s.Members, Member{ID: string(srv.ID), Addr: string(srv.Address), Suffrage: suffrage(srv.Suffrage)})
		}
	}
	return s
}

func suffrage(s raft.ServerSuffrage) string {
	switch s {
	case raft.Voter:
		return "voter"
	case raft.Nonvoter:
		return "nonvoter"
	case raft.Staging:
		return "staging"
	default:
		return strings.ToLower(s.String())
	}
}

// Addr is the raft address peers reach this node at: AdvertiseAddr, or
// the bound address (with a :0 port resolved).
func (n *Node) Addr() string { return string(n.trans.LocalAddr()) }

// Raft exposes the raft instance (tests, metrics).
func (n *Node) Raft() *raft.Raft { return n.raft }

// Shutdown stops the node. A leader with other voters first hands
// leadership over, so the cluster does not wait an election timeout for a
// successor. Safe to call more than once.
func (n *Node) Shutdown() error {
	n.shutdownOnce.Do(func() { n.shutdownErr = n.shutdown() })
	return n.shutdownErr
}

func (n *Node) shutdown() error {
	if n.raft.State() == raft.Leader && n.hasOtherVoters() {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTransferTimeout)
		leader, err := n.TransferLeadership(ctx, "")
		cancel()
		if err != nil {
			n.log.Warn("raft: leadership transfer before shutdown failed; peers will elect after a timeout", "error", err.Error())
		} else {
			n.log.Info("raft: leadership handed over before shutdown", "leader", leader)
		}
	}
	var errs []error
	// The shutdown future also closes the transport.
	if err := n.raft.Shutdown().Error(); err != nil {
		errs = append(errs, fmt.Errorf("raft shutdown: %w", err))
	}
	n.raft.DeregisterObserver(n.observer)
	close(n.stopCh)
	<-n.watchDone
	<-n.leadersDone
	if err := n.closeStores(); err != nil {
		errs = append(errs, err)
	}
	n.log.Info("raft: node stopped")
	return errors.Join(errs...)
}

func (n *Node) hasOtherVoters() bool {
	servers, err := n.servers()
	if err != nil {
		return false
	}
	for _, s := range servers {
		if s.Suffrage == raft.Voter && string(s.ID) != n.cfg.NodeID {
			return true
		}
	}
	return false
}

// restores reports how many snapshots the state machine installed.
func (n *Node) restores() uint64 { return n.fsm.restores.Load() }
