package service

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"connectrpc.com/connect"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/cpclient"
	"github.com/cartrouter/cart/controlplane/raftnode"
	"github.com/cartrouter/cart/controlplane/state"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
)

// AdminHandler implements cartv1connect.AdminServiceHandler. Writes go
// through Raft and are acknowledged only once committed; a follower
// forwards them to the leader, and a node without a leader refuses.
type AdminHandler struct{ c *Core }

// Admin returns the AdminService handler.
func (c *Core) Admin() *AdminHandler { return &AdminHandler{c} }

func (c *Core) apply(ctx context.Context, cmd *cartv1.RaftCommand) error {
	res, err := c.node.Apply(ctx, cmd)
	if err != nil {
		return c.writeError("commit", err)
	}
	if res.Err != nil {
		return connect.NewError(connect.CodeNotFound, res.Err)
	}
	return nil
}

// writeError maps a failed Raft write to one of the two failure outcomes a
// client must tell apart: not done (Unavailable, or FailedPrecondition
// naming the leader) and unknown (Aborted, see outcomeUnknown). Success is
// the third. An entry this node appended before losing leadership may
// still commit, so "unknown" wins over "not the leader".
func (c *Core) writeError(op string, err error) error {
	switch {
	case errors.Is(err, raftnode.ErrOutcomeUnknown):
		return c.outcomeUnknown(fmt.Errorf("%s: %w", op, err))
	case errors.Is(err, raftnode.ErrNotLeader):
		return c.notLeader(err)
	}
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%s: %w", op, err))
}

// outcomeUnknown builds the "may or may not have been applied" error.
// Aborted is chosen because nothing else in CART (nor the Connect and gRPC
// libraries on their own) produces it, so clients can rely on the code;
// Unavailable would read as "not done", and DeadlineExceeded is also what
// a client's own timeout looks like. The leader's URL is attached when
// known, as for "not the leader", so the retry can go straight there.
func (c *Core) outcomeUnknown(cause error) error {
	e := connect.NewError(connect.CodeAborted, fmt.Errorf("write outcome unknown, retry the same command (it is idempotent): %w", cause))
	e.Meta().Set(cpclient.HeaderWriteOutcome, cpclient.OutcomeUnknown)
	if id, _ := c.node.Leader(); id != "" {
		if url := c.st.Members()[id]; url != "" {
			c.withLeader(e, id, url)
		}
	}
	return e
}

// notLeader builds the "not leader" error, naming the leader when known.
// It means the write was not done.
func (c *Core) notLeader(cause error) error {
	id, _ := c.node.Leader()
	if id == "" {
		return c.withLeader(connect.NewError(connect.CodeUnavailable, errNoLeader), "", "")
	}
	url := c.st.Members()[id]
	return c.withLeader(connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("not the leader (%v); the leader is %s at %s", cause, id, url)), id, url)
}

func toSpec(w *cartv1.Worker) (*cartv1.WorkerSpec, error) {
	if w == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("worker is required"))
	}
	u, err := config.NormalizeWorkerURL(w.GetUrl())
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("worker url: %w", err))
	}
	role := w.GetRole()
	if !config.ValidRole(role) {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("worker role %q: want both, prefill or decode", role))
	}
	role = config.RoleStored(role)
	return &cartv1.WorkerSpec{Url: u, MaxLoad: w.GetMaxLoad(), MaxConcurrency: w.GetMaxConcurrency(), LoadPenalty: w.GetLoadPenalty(), CacheCapacityTokens: w.GetCacheCapacityTokens(), Source: state.SourceAdmin, Role: role}, nil
}

func (c *Core) findWorker(url string) (*cartv1.Worker, bool) {
	list, _ := c.workerList()
	for _, w := range list.GetWorkers() {
		if w.GetUrl() == url {
			return w, true
		}
	}
	return nil, false
}

// ListWorkers implements AdminService.ListWorkers. On a follower it asks
// the leader, whose health and load view is the live one.
func (h *AdminHandler) ListWorkers(ctx context.Context, req *connect.Request[cartv1.ListWorkersRequest]) (*connect.Response[cartv1.ListWorkersResponse], error) {
	c := h.c
	// With no leader reachable, this node's replicated copy is still useful
	// to an operator (health and load are then unknown).
	if resp, done, err := forward(ctx, c, req, (*forwarder).adminTo, cartv1connect.AdminServiceClient.ListWorkers); done && err == nil {
		return resp, nil
	}
	list, err := c.workerList()
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(list), nil
}

// AddWorker implements AdminService.AddWorker. Adding a worker that exists
// with the same settings succeeds (idempotent); with other settings it is
// AlreadyExists (use UpdateWorker).
func (h *AdminHandler) AddWorker(ctx context.Context, req *connect.Request[cartv1.AddWorkerRequest]) (*connect.Response[cartv1.AddWorkerResponse], error) {
	c := h.c
	who := c.actor(req.Peer().Addr, req.Header())
	if resp, done, err := forwardWrite(withActor(ctx, who), c, req, (*forwarder).adminTo, cartv1connect.AdminServiceClient.AddWorker); done {
		return resp, err
	}
	if err := c.seedDecided(ctx); err != nil {
		return nil, err
	}
	spec, err := toSpec(req.Msg.GetWorker())
	if err != nil {
		return nil, err
	}
	if w, ok := c.findWorker(spec.GetUrl()); ok {
		if w.GetMaxLoad() == spec.GetMaxLoad() && w.GetMaxConcurrency() == spec.GetMaxConcurrency() && w.GetLoadPenalty() == spec.GetLoadPenalty() && w.GetCacheCapacityTokens() == spec.GetCacheCapacityTokens() && config.RoleStored(w.GetRole()) == config.RoleStored(spec.GetRole()) {
			return connect.NewResponse(&cartv1.AddWorkerResponse{Worker: w}), nil
		}
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("worker %s already exists with other settings; use update", spec.GetUrl()))
	}
	w, err := c.upsertWorker(ctx, who, spec)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cartv1.AddWorkerResponse{Worker: w}), nil
}

// seedDecided waits until the config's workers are seeded, or it was
// decided not to seed them (Options.WorkerWritesAfter).
func (c *Core) seedDecided(ctx context.Context) error {
	if c.o.WorkerWritesAfter == nil {
		return nil
	}
	select {
	case <-c.o.WorkerWritesAfter:
		return nil
	case <-ctx.Done():
		return connect.NewError(connect.CodeUnavailable, errors.New("the worker set is still being seeded from this node's config; try again"))
	}
}

// upsertWorker commits spec and returns the worker as the applied log
// now has it, which is what add and update both answer with.
func (c *Core) upsertWorker(ctx context.Context, who string, spec *cartv1.WorkerSpec) (*cartv1.Worker, error) {
	if err := c.apply(ctx, &cartv1.RaftCommand{Actor: who, Body: &cartv1.RaftCommand_UpsertWorker{UpsertWorker: &cartv1.UpsertWorkerCommand{Worker: spec}}}); err != nil {
		return nil, err
	}
	w, _ := c.findWorker(spec.GetUrl())
	return w, nil
}

// UpdateWorker implements AdminService.UpdateWorker.
func (h *AdminHandler) UpdateWorker(ctx context.Context, req *connect.Request[cartv1.UpdateWorkerRequest]) (*connect.Response[cartv1.UpdateWorkerResponse], error) {
	c := h.c
	who := c.actor(req.Peer().Addr, req.Header())
	if resp, done, err := forwardWrite(withActor(ctx, who), c, req, (*forwarder).adminTo, cartv1connect.AdminServiceClient.UpdateWorker); done {
		return resp, err
	}
	if err := c.seedDecided(ctx); err != nil {
		return nil, err
	}
	spec, err := toSpec(req.Msg.GetWorker())
	if err != nil {
		return nil, err
	}
	cur, ok := c.findWorker(spec.GetUrl())
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("worker %s not found", spec.GetUrl()))
	}
	// Tuning a worker does not change where it came from: a discovered
	// worker stays under its source's control.
	spec.Source = cur.GetSource()
	w, err := c.upsertWorker(ctx, who, spec)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cartv1.UpdateWorkerResponse{Worker: w}), nil
}

// RemoveWorker implements AdminService.RemoveWorker. Requests in flight to
// the worker finish; no new ones are routed to it once the removal commits.
func (h *AdminHandler) RemoveWorker(ctx context.Context, req *connect.Request[cartv1.RemoveWorkerRequest]) (*connect.Response[cartv1.RemoveWorkerResponse], error) {
	c := h.c
	who := c.actor(req.Peer().Addr, req.Header())
	if resp, done, err := forwardWrite(withActor(ctx, who), c, req, (*forwarder).adminTo, cartv1connect.AdminServiceClient.RemoveWorker); done {
		return resp, err
	}
	if err := c.seedDecided(ctx); err != nil {
		return nil, err
	}
	u, err := config.NormalizeWorkerURL(req.Msg.GetUrl())
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("worker url: %w", err))
	}
	if _, ok := c.findWorker(u); !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("worker %s not found", u))
	}
	if err := c.apply(ctx, &cartv1.RaftCommand{Actor: who, Body: &cartv1.RaftCommand_RemoveWorker{RemoveWorker: &cartv1.RemoveWorkerCommand{Url: u}}}); err != nil {
		return nil, err
	}
	return connect.NewResponse(&cartv1.RemoveWorkerResponse{}), nil
}

// ClusterStatus implements AdminService.ClusterStatus: this node's view.
func (h *AdminHandler) ClusterStatus(_ context.Context, _ *connect.Request[cartv1.ClusterStatusRequest]) (*connect.Response[cartv1.ClusterStatusResponse], error) {
	c := h.c
	st := c.node.Status()
	members := c.st.Members()
	out := &cartv1.ClusterStatusResponse{
		NodeId: st.NodeID, State: st.State, LeaderId: st.LeaderID, LeaderUrl: members[st.LeaderID],
		Term: st.Term, CommitIndex: st.CommitIndex, AppliedIndex: st.AppliedIndex, LastLogIndex: st.LastLogIndex,
	}
	for _, m := range st.Members {
		out.Members = append(out.Members, &cartv1.Member{Id: m.ID, RaftAddress: m.Addr, ApiUrl: members[m.ID], Suffrage: m.Suffrage, Leader: m.ID == st.LeaderID})
	}
	ds := c.dec.Stats()
	out.Workers, out.HealthyWorkers = uint32(ds.Workers), uint32(ds.HealthyWorkers)
	out.IndexEntries, out.IndexEvictions, out.IndexSkippedInserts = uint64(ds.IndexEntries), ds.IndexEvicted, ds.IndexSkipped
	out.Dataplanes = uint32(ds.DataPlanes)
	return connect.NewResponse(out), nil
}

// AddVoter implements AdminService.AddVoter (a joining node calls it).
func (h *AdminHandler) AddVoter(ctx context.Context, req *connect.Request[cartv1.AddVoterRequest]) (*connect.Response[cartv1.AddVoterResponse], error) {
	c := h.c
	who := c.actor(req.Peer().Addr, req.Header())
	if resp, done, err := forwardWrite(withActor(ctx, who), c, req, (*forwarder).adminTo, cartv1connect.AdminServiceClient.AddVoter); done {
		return resp, err
	}
	m := req.Msg
	if m.GetId() == "" || m.GetRaftAddress() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("id and raft_address are required"))
	}
	old := c.membersString()
	if err := c.node.AddVoter(ctx, m.GetId(), m.GetRaftAddress()); err != nil {
		c.audit("audit: add voter failed", "actor", who, "member", m.GetId(), "raft_address", m.GetRaftAddress(), "error", err.Error())
		return nil, c.writeError("add voter "+m.GetId(), err)
	}
	c.audit("audit: voter added", "actor", who, "member", m.GetId(), "raft_address", m.GetRaftAddress(), "old", old, "new", c.membersString())
	if m.GetApiUrl() != "" {
		if err := c.apply(ctx, &cartv1.RaftCommand{Actor: who, Body: &cartv1.RaftCommand_SetMember{SetMember: &cartv1.SetMemberCommand{NodeId: m.GetId(), ApiUrl: m.GetApiUrl()}}}); err != nil {
			return nil, err
		}
	}
	return connect.NewResponse(&cartv1.AddVoterResponse{}), nil
}

// RemoveServer implements AdminService.RemoveServer.
func (h *AdminHandler) RemoveServer(ctx context.Context, req *connect.Request[cartv1.RemoveServerRequest]) (*connect.Response[cartv1.RemoveServerResponse], error) {
	c := h.c
	who := c.actor(req.Peer().Addr, req.Header())
	if resp, done, err := forwardWrite(withActor(ctx, who), c, req, (*forwarder).adminTo, cartv1connect.AdminServiceClient.RemoveServer); done {
		return resp, err
	}
	id := req.Msg.GetId()
	found := false
	for _, m := range c.node.Status().Members {
		found = found || m.ID == id
	}
	if !found {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("node %s is not a cluster member", id))
	}
	old := c.membersString()
	if err := c.node.RemoveServer(ctx, id); err != nil {
		c.audit("audit: remove server failed", "actor", who, "member", id, "error", err.Error())
		return nil, c.writeError("remove server "+id, err)
	}
	c.audit("audit: server removed", "actor", who, "member", id, "old", old, "new", c.membersString())
	if err := c.apply(ctx, &cartv1.RaftCommand{Actor: who, Body: &cartv1.RaftCommand_RemoveMember{RemoveMember: &cartv1.RemoveMemberCommand{NodeId: id}}}); err != nil && id != c.o.NodeID {
		return nil, err
	}
	return connect.NewResponse(&cartv1.RemoveServerResponse{}), nil
}

// TransferLeadership implements AdminService.TransferLeadership.
func (h *AdminHandler) TransferLeadership(ctx context.Context, req *connect.Request[cartv1.TransferLeadershipRequest]) (*connect.Response[cartv1.TransferLeadershipResponse], error) {
	c := h.c
	who := c.actor(req.Peer().Addr, req.Header())
	if resp, done, err := forward(withActor(ctx, who), c, req, (*forwarder).adminTo, cartv1connect.AdminServiceClient.TransferLeadership); done {
		return resp, err
	}
	old, _ := c.node.Leader()
	id, err := c.node.TransferLeadership(ctx, req.Msg.GetId())
	if err != nil {
		c.audit("audit: leadership transfer failed", "actor", who, "requested", req.Msg.GetId(), "error", err.Error())
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("transfer leadership: %w", err))
	}
	c.audit("audit: leadership transferred", "actor", who, "requested", req.Msg.GetId(), "old", old, "new", id)
	return connect.NewResponse(&cartv1.TransferLeadershipResponse{LeaderId: id}), nil
}

// membersString renders the Raft configuration for the audit log.
func (c *Core) membersString() string {
	ms := c.node.Status().Members
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = fmt.Sprintf("%s@%s(%s)", m.ID, m.Addr, m.Suffrage)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// Queue implements AdminService.Queue: the leader's flow-control queue,
// in dispatch order, and the pool's saturation.
func (h *AdminHandler) Queue(ctx context.Context, req *connect.Request[cartv1.QueueRequest]) (*connect.Response[cartv1.QueueResponse], error) {
	c := h.c
	if resp, done, err := forward(ctx, c, req, (*forwarder).adminTo, cartv1connect.AdminServiceClient.Queue); done {
		return resp, err
	}
	q := c.dec.Queue()
	p := c.dec.PoolSaturation()
	out := &cartv1.QueueResponse{Bytes: q.Bytes, Slots: uint32(p.Slots), Demand: p.Demand, Served: q.Served}
	for _, it := range q.Items {
		out.Requests = append(out.Requests, &cartv1.QueuedRequest{Tenant: it.Tenant, Label: it.Label, Priority: int32(it.Priority),
			WaitedMicros: it.Waited.Microseconds(), Bytes: it.Bytes})
	}
	return connect.NewResponse(out), nil
}
