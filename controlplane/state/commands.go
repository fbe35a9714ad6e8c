package state

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/cartrouter/cart/controlplane/engine"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// lockedFn applies one command inside the decider's critical section and
// returns what the proposer gets and what the audit log records.
type lockedFn func(s *State, eng *engine.Engine, cmd *cartv1.RaftCommand) (Result, *auditEvent)

// lockedCommands is the command registry (Consul's registerCommand
// shape): one entry per RaftCommand body applied in one lock hold. The
// placement batches are applied in steps (applyPlacements) and are the
// only bodies Apply handles itself; TestEveryCommandRegistered fails when
// a body is neither.
var lockedCommands = map[protoreflect.Name]lockedFn{}

// stepped are the bodies Apply applies in bounded steps, outside the
// registry.
var stepped = map[protoreflect.Name]bool{"place_batch": true, "unplace_batch": true}

func registerCommand(name protoreflect.Name, fn lockedFn) {
	if _, dup := lockedCommands[name]; dup || stepped[name] {
		panic(fmt.Sprintf("state: command %s registered twice", name))
	}
	lockedCommands[name] = fn
}

var bodyField = (&cartv1.RaftCommand{}).ProtoReflect().Descriptor().Oneofs().ByName("body")

// bodyName is the name of cmd's body field ("upsert_worker", ...), "" when
// it has none.
func bodyName(cmd *cartv1.RaftCommand) protoreflect.Name {
	if f := cmd.ProtoReflect().WhichOneof(bodyField); f != nil {
		return f.Name()
	}
	return ""
}

func init() {
	registerCommand("upsert_worker", func(s *State, eng *engine.Engine, cmd *cartv1.RaftCommand) (Result, *auditEvent) {
		ev := s.upsert(eng, cmd.GetUpsertWorker().GetWorker())
		return Result{WorkersVersion: s.workersVersion}, ev
	})
	registerCommand("remove_worker", func(s *State, eng *engine.Engine, cmd *cartv1.RaftCommand) (Result, *auditEvent) {
		url := cmd.GetRemoveWorker().GetUrl()
		old, ok := s.workerString(url)
		if !s.remove(eng, url) {
			return Result{WorkersVersion: s.workersVersion, Err: fmt.Errorf("worker %q not found", url)}, nil
		}
		var ev *auditEvent
		if ok {
			ev = &auditEvent{"audit: worker removed", []any{"worker", url, "old", old, "new", "(none)"}}
		}
		return Result{WorkersVersion: s.workersVersion}, ev
	})
	registerCommand("set_workers", func(s *State, eng *engine.Engine, cmd *cartv1.RaftCommand) (Result, *auditEvent) {
		old := s.workerSetString()
		s.specs = s.specs[:0]
		clear(s.capacity)
		for _, w := range cmd.GetSetWorkers().GetWorkers() {
			s.specs = append(s.specs, s.specFrom(eng, w))
			s.capacity[w.GetUrl()] = w.GetCacheCapacityTokens()
		}
		s.commitWorkers(eng)
		return Result{WorkersVersion: s.workersVersion}, &auditEvent{"audit: worker set replaced", []any{"old", old, "new", s.workerSetString()}}
	})
	registerCommand("clear_holdings", func(s *State, eng *engine.Engine, cmd *cartv1.RaftCommand) (Result, *auditEvent) {
		// An engine's own report that its KV cache is empty (kvtruth).
		for _, w := range cmd.GetClearHoldings().GetWorkers() {
			eng.ClearHoldings(w)
		}
		return Result{WorkersVersion: s.workersVersion}, nil
	})
	registerCommand("set_member", func(s *State, _ *engine.Engine, cmd *cartv1.RaftCommand) (Result, *auditEvent) {
		id, url := cmd.GetSetMember().GetNodeId(), cmd.GetSetMember().GetApiUrl()
		old, had := s.members[id]
		s.members[id] = url
		var ev *auditEvent
		if !had || old != url {
			ev = &auditEvent{"audit: member API URL set", []any{"member", id, "old", orNone(old), "new", url}}
		}
		return Result{WorkersVersion: s.workersVersion}, ev
	})
	registerCommand("remove_member", func(s *State, _ *engine.Engine, cmd *cartv1.RaftCommand) (Result, *auditEvent) {
		id := cmd.GetRemoveMember().GetNodeId()
		var ev *auditEvent
		if old, had := s.members[id]; had {
			delete(s.members, id)
			ev = &auditEvent{"audit: member removed from the node directory", []any{"member", id, "old", old, "new", "(none)"}}
		}
		return Result{WorkersVersion: s.workersVersion}, ev
	})
}

// applyTimes is cart_state_apply_seconds: how long applying each command
// kind takes on this node, lock waits and steps included.
func newApplyTimes() *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "cart_state_apply_seconds",
		Help:    "Time to apply one Raft log entry on this node, by command (lock waits and stepped batches included).",
		Buckets: []float64{1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5}}, []string{"command"})
}

// observeApply records one apply of the named command.
func (s *State) observeApply(name protoreflect.Name, start time.Time) {
	if name == "" {
		name = "unknown"
	}
	s.applyTimes.WithLabelValues(string(name)).Observe(time.Since(start).Seconds())
}

// Collectors are the state machine's metrics, for the node's registry.
func (s *State) Collectors() []prometheus.Collector { return []prometheus.Collector{s.applyTimes} }
