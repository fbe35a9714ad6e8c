package state

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// CommandVersion is the newest envelope version this node understands.
const CommandVersion = 1

// ErrUnknownCommand means an entry this node cannot apply. Applying past
// it would make this node diverge from its peers, so the adapter stops the
// node instead (unless the entry is flagged ignorable).
var ErrUnknownCommand = errors.New("unknown or undecodable log command")

// State is the replicated state over a decider's engine. Its own fields
// change only inside the decider's critical section.
type State struct {
	dec        *decider.Decider
	applyTimes *prometheus.HistogramVec

	specs          []engine.WorkerSpec
	capacity       map[string]int64 // cache_capacity_tokens per worker URL
	workersVersion uint64
	members        map[string]string // node id -> API URL
	applied        uint64

	own OwnBatches

	// audit, when set, receives one INFO line per worker-set or node
	// directory change, on every node that applies it.
	audit atomic.Pointer[slog.Logger]
	// origins keeps the Responses API origins (nil: dropped).
	origins Origins
}

// Origins is where the node keeps Responses API origins (the service's
// table of which worker stored which response). They are facts, not
// routing decisions: learned from place batches, carried in snapshots, and
// never undone.
type Origins interface {
	// Learn records origins from a place batch this node did not propose.
	Learn([]*cartv1.ResponseOrigin)
	// Stored lists the origins for a snapshot, most recently used first.
	Stored() []*cartv1.StoredOrigin
	// Restore adds a restored snapshot's origins to those known: they
	// are facts, so what the node learned before stays too.
	Restore([]*cartv1.StoredOrigin)
}

// SetAuditLog makes every applied worker-set and node-directory change
// log who asked (the command's actor), what, and old -> new.
func (s *State) SetAuditLog(l *slog.Logger) { s.audit.Store(l) }

// OwnBatches is the leader's ledger of the index changes it made at
// decision time, ahead of the log (see controlplane/service). The state
// tells it what the log decides, so that the ledger can undo exactly the
// changes that never commit. Every method is called with the engine lock
// held (inside Decider.Do).
type OwnBatches interface {
	// Own reports (and forgets) a placement batch this node proposed and
	// whose changes its index already holds: applying it again would only
	// hold the lock.
	Own(requestID string) bool
	// Committed is told of every placement or withdrawal applied from the
	// log that was not Own: from then on the log decides whether worker
	// holds hashes, not a pending change made before.
	Committed(worker string, hashes []uint64)
	// Restored is told that a snapshot replaced the index.
	Restored()
	// Uncommitted calls fn with the changes that take the index back to
	// what the log says, in order: insert=false removes worker as holder
	// of hashes, insert=true restores it (placed at at). eng is the
	// decider's engine, lent for the call.
	Uncommitted(eng *engine.Engine, fn func(insert bool, worker string, hashes []uint64, at int64))
}

// SetOwnBatches installs the leader's ledger. Call it before the first
// Apply.
func (s *State) SetOwnBatches(o OwnBatches) { s.own = o }

// SetResponseOrigins installs where the node keeps Responses API origins.
// Call it before the first Apply or Restore.
func (s *State) SetResponseOrigins(o Origins) { s.origins = o }

// placementChunk bounds how many placements one lock hold applies, so
// routing decisions interleave with a large batch instead of waiting for
// all of it (applyBlockBudget bounds their blocks).
const placementChunk = 32

// New builds the state machine over dec's engine.
func New(dec *decider.Decider) *State {
	return &State{dec: dec, applyTimes: newApplyTimes(), capacity: map[string]int64{}, members: map[string]string{}}
}

// Encode serialises a command for the log, stamping the current version.
// The caller's command is not modified, so one command may be shared.
func Encode(cmd *cartv1.RaftCommand) ([]byte, error) {
	if cmd.GetVersion() == 0 {
		cmd = withVersion(cmd, CommandVersion)
	}
	b, err := proto.Marshal(cmd)
	if err != nil {
		return nil, fmt.Errorf("encode command: %w", err)
	}
	return b, nil
}

// withVersion is a shallow copy of cmd with version v: its fields are
// shared, not copied. A deep copy of a placement batch (every
// placement's hashes) doubled what the leader's batcher allocates per
// proposal (BenchmarkEncodePlaceBatch), and what a goroutine allocates
// during a GC cycle it pays for in mark assist, while a node with one P
// runs nothing else.
func withVersion(cmd *cartv1.RaftCommand, v uint32) *cartv1.RaftCommand {
	c := &cartv1.RaftCommand{}
	src, dst := cmd.ProtoReflect(), c.ProtoReflect()
	src.Range(func(fd protoreflect.FieldDescriptor, val protoreflect.Value) bool {
		dst.Set(fd, val)
		return true
	})
	dst.SetUnknown(src.GetUnknown())
	c.Version = v
	return c
}

// Result is what applying a command returns to the proposer.
type Result struct {
	WorkersVersion uint64
	Err            error // a rejected but well-formed command (e.g. remove of an unknown worker)
}

// Apply decodes and applies one log entry at the given log index. It
// returns ErrUnknownCommand (wrapped) for entries that must stop the node.
func (s *State) Apply(index uint64, data []byte) (Result, error) {
	if d, ok := decodePlaceBatch(data); ok {
		defer d.release()
		defer s.observeApply("place_batch", time.Now())
		s.applyPlaceBatch(index, &d.b)
		return Result{}, nil
	}
	var cmd cartv1.RaftCommand
	if err := proto.Unmarshal(data, &cmd); err != nil {
		return Result{}, fmt.Errorf("%w: log index %d: %v", ErrUnknownCommand, index, err)
	}
	defer s.observeApply(bodyName(&cmd), time.Now())
	if cmd.GetVersion() > CommandVersion || cmd.GetBody() == nil {
		if cmd.GetIgnorable() {
			s.dec.Do(decider.OpApply, func(*engine.Engine) { s.applied = index })
			return Result{}, nil
		}
		return Result{}, fmt.Errorf("%w: log index %d: version %d, body %T", ErrUnknownCommand, index, cmd.GetVersion(), cmd.GetBody())
	}
	if b, ok := cmd.GetBody().(*cartv1.RaftCommand_PlaceBatch); ok {
		s.applyPlaceBatch(index, decodedBatchOf(cmd.GetRequestId(), b.PlaceBatch))
		return Result{}, nil
	}
	if b, ok := cmd.GetBody().(*cartv1.RaftCommand_UnplaceBatch); ok {
		// Older versions wrote withdrawals as their own entries (they now
		// ride in PlaceBatch); applied so that those logs still replay. In
		// steps, like placements: a batch of withdrawals is as large.
		s.applyPlacements(placementsOf(b.UnplaceBatch.GetPlacements()), applyRemove)
		var res Result
		s.dec.Do(decider.OpApplyBatch, func(*engine.Engine) { s.applied = index; res = Result{WorkersVersion: s.workersVersion} })
		return res, nil
	}
	var res Result
	var ev *auditEvent
	s.dec.Do(decider.OpApply, func(eng *engine.Engine) { res, ev = s.applyLocked(eng, index, &cmd) })
	if cmd.GetRemoveWorker() != nil || cmd.GetSetWorkers() != nil || cmd.GetClearHoldings() != nil {
		s.dec.Purge() // a removed or cleared worker's holdings, in short lock holds
	}
	if al := s.audit.Load(); ev != nil && al != nil {
		// Logged outside the engine lock: routing must not wait on log I/O.
		al.Info(ev.msg, append([]any{"audit", true, "index", index, "actor", cmd.GetActor(), "request_id", cmd.GetRequestId()}, ev.args...)...)
	}
	return res, nil
}

// applyPlaceBatch applies the PlaceBatch command at index.
func (s *State) applyPlaceBatch(index uint64, b *decodedBatch) {
	// Asked under the lock: the ledger may be undoing this very batch
	// (its proposer gave up on it) and must either finish first, so the
	// batch is applied here as anyone's, or see it committed.
	var own bool
	s.dec.Do(decider.OpApplyBatch, func(*engine.Engine) { own = s.own != nil && s.own.Own(b.requestID) })
	if !own {
		// Touches first: they record what the leader's index held when
		// it decided, before this window's withdrawals took any of it
		// back. They only refresh the recency of what this node holds
		// (the leading blocks of each path it still has for the
		// worker), never add a holding: the leader may have withdrawn
		// the placement a touch refreshed (undelivered in the same
		// window, so never replicated), and a touch that added it
		// would leave every follower holding what the leader does not.
		// A batch without them, as older leaders write, leaves recency
		// as it was.
		s.applyPlacements(b.touches, applyRefresh)
		s.applyPlacements(b.withdrawals, applyRemove)
		s.applyPlacements(b.placements, applyInsert)
		if len(b.origins) > 0 && s.origins != nil {
			s.origins.Learn(b.origins)
		}
	}
	s.dec.Do(decider.OpApplyBatch, func(*engine.Engine) { s.applied = index })
}

// auditEvent describes one applied change for the audit log.
type auditEvent struct {
	msg  string
	args []any
}

func (s *State) applyLocked(eng *engine.Engine, index uint64, cmd *cartv1.RaftCommand) (Result, *auditEvent) {
	s.applied = index
	if fn := lockedCommands[bodyName(cmd)]; fn != nil {
		return fn(s, eng, cmd)
	}
	return Result{WorkersVersion: s.workersVersion}, nil
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// workerString renders one worker's replicated settings for the audit log.
func (s *State) workerString(url string) (string, bool) {
	i := slices.IndexFunc(s.specs, func(w engine.WorkerSpec) bool { return w.URL == url })
	if i < 0 {
		return "(none)", false
	}
	w := s.specs[i]
	out := fmt.Sprintf("%s max_load=%d max_concurrency=%d load_penalty=%d cache_capacity_tokens=%d", w.URL, w.MaxLoad, w.MaxConcurrency, w.LoadPenalty, s.capacity[w.URL])
	if w.Role != engine.RoleBoth {
		out += " role=" + w.Role.String()
	}
	return out, true
}

func (s *State) workerSetString() string {
	parts := make([]string, len(s.specs))
	for i, w := range s.specs {
		parts[i], _ = s.workerString(w.URL)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// How applyPlacements applies a list of placements.
type applyMode int

const (
	applyInsert  applyMode = iota // placements: the worker holds the path
	applyRemove                   // withdrawals: it no longer holds it
	applyRefresh                  // touches: recency of what it still holds
)

// applyPlacements inserts (or withdraws, or refreshes) placements in
// chunks, leaving the decider's critical section between chunks.
// Snapshots cannot interleave (raft never runs Snapshot concurrently with
// Apply), only routing decisions can.
func (s *State) applyPlacements(ps []placement, mode applyMode) {
	for step := range placementSteps(ps) {
		s.dec.Do(decider.OpApplyBatch, func(eng *engine.Engine) { s.applyStep(eng, step, mode) })
	}
}

// applyStep applies one step of placements. Inside the decider's critical
// section.
func (s *State) applyStep(eng *engine.Engine, ps []placement, mode applyMode) {
	idx := eng.Index()
	for _, p := range ps {
		id, ok := eng.WorkerIDOf(p.worker)
		if !ok {
			continue
		}
		hashes := p.hashes
		switch mode {
		case applyInsert:
			eng.ApplyPlacement(p.worker, hashes, p.at)
		case applyRemove:
			idx.RemoveHolder(hashes, indexID(id))
		case applyRefresh:
			if hashes = eng.ApplyTouch(p.worker, hashes, p.at); len(hashes) == 0 {
				continue
			}
		}
		if s.own != nil {
			s.own.Committed(p.worker, hashes)
		}
	}
}

func (s *State) specFrom(eng *engine.Engine, w *cartv1.WorkerSpec) engine.WorkerSpec {
	// The admin API and discovery propose known roles only; a role this
	// build does not know (a newer node's) reads as both.
	role, _ := engine.ParseRole(w.GetRole())
	spec := engine.WorkerSpec{URL: w.GetUrl(), MaxLoad: int(w.GetMaxLoad()), MaxConcurrency: int(w.GetMaxConcurrency()), LoadPenalty: int(w.GetLoadPenalty()), Source: SourceOf(w.GetSource()), Role: role}
	spec.CapacityBlocks = index.CapacityBlocks(w.GetCacheCapacityTokens(), eng.Policy().BlockChars)
	return spec
}

func (s *State) upsert(eng *engine.Engine, w *cartv1.WorkerSpec) *auditEvent {
	if w.GetUrl() == "" {
		return nil // malformed proposal; the admin API validates before proposing
	}
	spec := s.specFrom(eng, w)
	old, existed := s.workerString(spec.URL)
	oldCapacity := s.capacity[spec.URL]
	s.capacity[spec.URL] = w.GetCacheCapacityTokens()
	changed := func(msg string) *auditEvent {
		now, _ := s.workerString(spec.URL)
		return &auditEvent{msg, []any{"worker", spec.URL, "old", old, "new", now}}
	}
	for i := range s.specs {
		if s.specs[i].URL == spec.URL {
			if s.specs[i] == spec {
				// Idempotent re-apply: no version bump. Only the modelled
				// capacity in tokens may differ (same blocks).
				if existed && oldCapacity != w.GetCacheCapacityTokens() {
					return changed("audit: worker updated")
				}
				return nil
			}
			s.specs[i] = spec
			s.commitWorkers(eng)
			return changed("audit: worker updated")
		}
	}
	s.specs = append(s.specs, spec)
	s.commitWorkers(eng)
	return changed("audit: worker added")
}

func (s *State) remove(eng *engine.Engine, url string) bool {
	i := slices.IndexFunc(s.specs, func(w engine.WorkerSpec) bool { return w.URL == url })
	if i < 0 {
		return false
	}
	s.specs = slices.Delete(s.specs, i, i+1)
	delete(s.capacity, url)
	s.commitWorkers(eng)
	return true
}

func (s *State) commitWorkers(eng *engine.Engine) {
	eng.SetWorkers(slices.Clone(s.specs))
	s.workersVersion++
}

// Worker sources (config.Source*). Entries written before sources existed
// carry none and read as static (they came from the config seed or
// cartctl, which the log did not tell apart).
const (
	SourceStatic = config.SourceStatic
	SourceAdmin  = config.SourceAdmin
	SourceDNS    = config.SourceDNS
	// SourceKubernetes: EndpointSlices or pods watched through the
	// Kubernetes API.
	SourceKubernetes = config.SourceKubernetes
)

// SourceOf maps a replicated source to its name, empty reading as static.
func SourceOf(s string) string {
	if s == "" {
		return SourceStatic
	}
	return s
}

// Worker is a replicated worker spec with its modelled cache capacity.
type Worker struct {
	engine.WorkerSpec
	CacheCapacityTokens int64
}

// Workers returns the replicated worker set and its version.
func (s *State) Workers() (out []Worker, version uint64) {
	s.dec.Do(decider.OpRead, func(*engine.Engine) {
		out = make([]Worker, len(s.specs))
		for i, w := range s.specs {
			out[i] = Worker{WorkerSpec: w, CacheCapacityTokens: s.capacity[w.URL]}
		}
		version = s.workersVersion
	})
	return out, version
}

// Members returns the node directory (node id -> API URL).
func (s *State) Members() (m map[string]string) {
	s.dec.Do(decider.OpRead, func(*engine.Engine) { m = maps.Clone(s.members) })
	return m
}

// Applied is the last applied log index.
func (s *State) Applied() (applied uint64) {
	s.dec.Do(decider.OpRead, func(*engine.Engine) { applied = s.applied })
	return applied
}

// roleName is a role as WorkerSpec.role carries it (config.RoleStored).
func roleName(r engine.Role) string { return config.RoleStored(r.String()) }
