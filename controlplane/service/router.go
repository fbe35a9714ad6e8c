package service

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/cartrouter/cart/controlplane/affinity"
	"github.com/cartrouter/cart/controlplane/cpclient"
	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
)

// RouterHandler implements cartv1connect.RouterServiceHandler.
type RouterHandler struct{ c *Core }

// Router returns the RouterService handler.
func (c *Core) Router() *RouterHandler { return &RouterHandler{c} }

// maxSessionKey is the longest session key kept as is. Data planes send a
// 32-character hash; a longer key is hashed here, before the routing lock,
// so that hashing it inside the engine costs nothing.
const maxSessionKey = 64

// maxListedWorkers bounds exclude_workers plus avoid_workers: the engine
// checks each candidate against both lists under the routing lock, so a
// caller naming thousands would hold it for every route. A data plane
// names the workers of its own failed attempts and open breakers, far
// fewer.
const maxListedWorkers = 1024

// Route implements RouterService.Route.
func (h *RouterHandler) Route(ctx context.Context, req *connect.Request[cartv1.RouteRequest]) (*connect.Response[cartv1.RouteResponse], error) {
	c := h.c
	if resp, done, err := forward(ctx, c, req, (*forwarder).routerTo, cartv1connect.RouterServiceClient.Route); done {
		return resp, err
	}
	resp, err := c.decide(ctx, req.Msg, nil, nil)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

// decide is the leader's Route, for the unary call and the stream.
// expired, when set, reports that the caller stopped waiting
// (decider.Caller.Expired). queued, when set, is told (once) that the call
// waits in the flow-control queue: the stream sends the interim answer.
func (c *Core) decide(ctx context.Context, m *cartv1.RouteRequest, expired func() bool, queued func()) (*cartv1.RouteResponse, error) {
	start := time.Now()
	hashes, keyLen := m.GetBlockHashes(), int(m.GetKeyLength())
	if text := m.GetText(); len(hashes) == 0 && text != "" {
		keyLen = len(text)
		// Only the prefix the engine looks at is worth hashing.
		if lim := engine.MaxRouteBlocks * c.o.BlockChars; len(text) > lim {
			text = text[:lim]
		}
		hashes = index.Hash(nil, m.GetModel(), []byte(text), c.o.BlockChars)
	}
	if keyLen == 0 && len(hashes) > 0 {
		keyLen = len(hashes) * c.o.BlockChars // length not given: assume full blocks
	}
	// A longer prompt is routed on its first MaxRouteBlocks blocks (the
	// engine ignores the rest) rather than refused: prefix matching needs
	// only the prefix, and refusing would send the data plane to its
	// local fallback for every long prompt.
	hashes = hashes[:min(len(hashes), engine.MaxRouteBlocks)]
	session := m.GetSessionKey()
	if len(session) > maxSessionKey {
		sum := sha256.Sum256([]byte(session))
		session = hex.EncodeToString(sum[:16])
	}
	settle := completions(m.GetCompletions())
	// The settlements that came with the call stand whatever becomes of
	// the call itself.
	refuse := func(err error) (*cartv1.RouteResponse, error) {
		if len(settle) > 0 {
			c.dec.Complete(m.GetDataplaneId(), settle)
		}
		return nil, err
	}
	exclude := m.GetExcludeWorkers()
	if n := len(exclude) + len(m.GetAvoidWorkers()); n > maxListedWorkers {
		return refuse(connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("exclude_workers and avoid_workers name %d workers, at most %d", n, maxListedWorkers)))
	}
	if ex, err := c.models.Exclude(m.GetModel()); err != nil {
		return refuse(connect.NewError(connect.CodeNotFound, err))
	} else if len(ex) > 0 {
		exclude = append(slices.Clip(exclude), ex...)
	}
	now := c.o.Now()
	pin, err := c.pinnedWorker(m.GetResponseIdHash(), m.GetTenantHash(), now)
	if err != nil {
		return refuse(err)
	}
	caller := decider.Caller{DataPlane: m.GetDataplaneId(), RouteID: m.GetRouteId(), Expired: expired, Settle: settle}
	dreq := decider.Request{
		Request: engine.Request{Hashes: hashes, KeyLen: keyLen, Exclude: exclude, Avoid: m.GetAvoidWorkers(), DryRun: m.GetDryRun(), Session: session,
			Disagg: cpclient.DisaggFromWire(m.GetDisaggregation())},
		PinTo: pin,
	}
	var d decider.Decision
	if a := m.GetAdmission(); a != nil && !m.GetDryRun() {
		adm, wait, cancel := c.admission(ctx, m, a, &caller, queued)
		d, err = c.dec.AdmitFor(wait, caller, dreq, adm)
		cancel()
	} else {
		d, err = c.dec.DecideFor(ctx, caller, dreq)
	}
	if err != nil && m.GetDryRun() && errors.Is(err, engine.ErrAllSaturated) && c.o.FlowOn {
		// What a live request would meet: the queue, not a refusal.
		id, _ := c.node.Leader()
		return &cartv1.RouteResponse{Queued: true, QueueDepth: uint32(c.dec.QueueLen()), FromLeader: true, LeaderId: id, LeaderUrl: c.o.APIURL,
			DecisionMicros: time.Since(start).Microseconds()}, nil
	}
	if err != nil {
		return nil, routeError(ctx, err)
	}
	elapsed := time.Since(start)
	if !m.GetDryRun() {
		// The prompt's placement is the prefill worker's when split.
		placed := d.Worker
		if d.Split() {
			placed = d.Prefill.Worker
		}
		c.placements.add(placed, m.GetDataplaneId(), m.GetRouteId(), hashes)
	}
	c.metrics.routes.WithLabelValues(string(d.Reason)).Inc()
	c.metrics.routeTime.Observe(elapsed.Seconds())
	id, _ := c.node.Leader()
	var prefill *cartv1.PrefillLeg
	if p := d.Prefill; p != nil {
		prefill = &cartv1.PrefillLeg{Worker: p.Worker, Ticket: d.PrefillTicket.ID, Reason: string(p.Reason), MatchedChars: uint32(p.MatchedChars),
			MatchedRatio: p.MatchedRatio, Candidate: p.Candidate, ChosenChars: uint32(p.ChosenChars), WorkerSource: p.WorkerSource}
	}
	return &cartv1.RouteResponse{
		Prefill:        prefill,
		Whole:          d.Whole,
		Worker:         d.Worker,
		Reason:         string(d.Reason),
		MatchedChars:   uint32(d.MatchedChars),
		MatchedRatio:   d.MatchedRatio,
		DecisionMicros: elapsed.Microseconds(),
		FromLeader:     true,
		Candidate:      d.Candidate,
		ChosenChars:    uint32(d.ChosenChars),
		Ticket:         d.Ticket.ID,
		LeaderId:       id,
		LeaderUrl:      c.o.APIURL, // this node's own, as published by ensureMember
		Pinned:         d.Pinned,
		AvoidIgnored:   d.AvoidIgnored,
		WaitedMicros:   d.Waited.Microseconds(),
		QueueDepth:     uint32(d.QueueDepth),
		WorkerSource:   d.WorkerSource,
	}, nil
}

// pinnedWorker resolves a request for a stored response: when this leader
// learned which worker produced it, the decision is pinned to that worker
// (the response lives there only; load and prefix do not matter).
// "" when the request names no response or one this leader does not know
// (never seen, or forgotten): routed like any request. A response of
// another tenant is NOT_FOUND with a ResponseNotFound detail: the data
// plane answers as the engine does for an unknown id, and the request
// reaches no worker.
func (c *Core) pinnedWorker(hash, tenant uint64, now time.Time) (string, error) {
	if hash == 0 {
		return "", nil
	}
	o, ok := c.responses.Lookup(hash, tenant, now)
	if ok && o.Foreign(tenant) {
		e := connect.NewError(connect.CodeNotFound, errors.New("the stored response belongs to another tenant"))
		if d, err := connect.NewErrorDetail(&cartv1.ResponseNotFound{}); err == nil {
			e.AddDetail(d)
		}
		return "", e
	}
	return o.Worker, nil
}

// routeError maps the decider's answers to Connect codes. "Nobody can take
// this" is ResourceExhausted, which data planes pass on as 503 instead of
// falling back: the control plane answered, and the answer is that the
// pool is full or down.
func routeError(ctx context.Context, err error) error {
	var gone *decider.PinnedGoneError
	switch {
	case errors.Is(err, decider.ErrNotLeading):
		return connect.NewError(connect.CodeUnavailable, err)
	case errors.As(err, &gone):
		// Not NotFound, which says "model not served": the data plane must
		// tell the two apart to answer the client the right error.
		return connect.NewError(connect.CodeFailedPrecondition, err)
	case ctx.Err() != nil && errors.Is(err, ctx.Err()), errors.Is(err, context.DeadlineExceeded):
		// The caller's deadline passed while this waited for the lock or
		// decided: it has routed elsewhere; the decider undid the decision.
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	case errors.Is(err, decider.ErrRefused):
		// Flow control turned it away: the detail tells the data plane to
		// answer 429, not the 503 of an empty pool.
		var re *decider.RefusedError
		errors.As(err, &re)
		ce := connect.NewError(connect.CodeResourceExhausted, err)
		if d, derr := connect.NewErrorDetail(&cartv1.FlowRefused{Reason: re.Reason, RetryAfterMillis: uint32(re.RetryAfter.Milliseconds())}); derr == nil {
			ce.AddDetail(d)
		}
		return ce
	case errors.Is(err, decider.ErrNoCapacity):
		ce := connect.NewError(connect.CodeResourceExhausted, err)
		if errors.Is(err, engine.ErrAllSaturated) {
			// Full, not empty: a data plane whose stream is reconnecting
			// waits for it and asks again instead of answering 503.
			if d, derr := connect.NewErrorDetail(&cartv1.PoolSaturated{}); derr == nil {
				ce.AddDetail(d)
			}
		}
		return ce
	}
	return connect.NewError(connect.CodeInternal, err)
}

// Complete implements RouterService.Complete.
func (h *RouterHandler) Complete(ctx context.Context, req *connect.Request[cartv1.CompleteRequest]) (*connect.Response[cartv1.CompleteResponse], error) {
	c := h.c
	if resp, done, err := forward(ctx, c, req, (*forwarder).routerTo, cartv1connect.RouterServiceClient.Complete); done {
		return resp, err
	}
	return connect.NewResponse(c.complete(req.Msg)), nil
}

// complete is the leader's Complete, for the unary call and the stream.
func (c *Core) complete(m *cartv1.CompleteRequest) *cartv1.CompleteResponse {
	now := c.o.Now()
	dpID := m.GetDataplaneId()
	var origins []*cartv1.ResponseOrigin
	for _, o := range m.GetResponseOrigins() {
		if o.GetIdHash() != 0 && o.GetWorker() != "" {
			c.responses.Learn(o.GetIdHash(), affinity.Origin{Worker: o.GetWorker(), Tenant: o.GetTenantHash()}, now)
			origins = append(origins, &cartv1.ResponseOrigin{IdHash: o.GetIdHash(), Worker: o.GetWorker(), TenantHash: o.GetTenantHash()})
		}
	}
	if len(origins) > 0 {
		// Replicated with the placements, so a new leader keeps them.
		c.batch.Origins(origins)
	}
	for _, comp := range m.GetCompletions() {
		if comp.GetAbandoned() {
			// A call still waiting in the queue leaves it now; one that
			// was dispatched is settled below as abandoned.
			c.queuedCalls.cancel(routeKey{dpID, comp.GetRouteId()})
		}
	}
	return &cartv1.CompleteResponse{Settled: uint32(c.dec.Complete(dpID, completions(m.GetCompletions())))}
}

// completions converts a data plane's reported settlements.
func completions(cs []*cartv1.Completion) []decider.Completion {
	if len(cs) == 0 {
		return nil
	}
	out := make([]decider.Completion, len(cs))
	for i, comp := range cs {
		out[i] = decider.Completion{Ticket: comp.GetTicket(), Worker: comp.GetWorker(), Abandoned: comp.GetAbandoned(), RouteID: comp.GetRouteId(), DoneSeq: comp.GetDoneSeq(),
			Outcome: decider.Outcome{Delivered: comp.GetDelivered(), PromptTokens: int(comp.GetPromptTokens()), CachedTokens: int(comp.GetCachedTokens()),
				CompletionTokens: int(comp.GetCompletionTokens())}}
	}
	return out
}

// Sync implements RouterService.Sync: the data plane's absolute in-flight
// counts, with what its fence says they could not include yet, replace
// what the leader had for it (reconciling drift both ways), and the answer
// carries the worker set with live health and load.
func (h *RouterHandler) Sync(ctx context.Context, req *connect.Request[cartv1.SyncRequest]) (*connect.Response[cartv1.SyncResponse], error) {
	c := h.c
	if resp, done, err := forward(ctx, c, req, (*forwarder).routerTo, cartv1connect.RouterServiceClient.Sync); done {
		return resp, err
	}
	resp, err := c.sync(req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

// sync is the leader's Sync, for the unary call and the stream.
func (c *Core) sync(m *cartv1.SyncRequest) (*cartv1.SyncResponse, error) {
	c.handover.report(m, c.o.Now())
	reported := make(map[string]int, len(m.GetLoads()))
	for _, l := range m.GetLoads() {
		reported[l.GetWorker()] = int(l.GetInFlight())
	}
	_, version := c.st.Workers()
	c.dec.SyncLoads(m.GetDataplaneId(), version, reported, m.GetFallbacks(), decider.SyncFence{
		FirstRouteID: m.GetFirstRouteId(), SyncSeq: m.GetSyncSeq(),
		LastRouteID: m.GetLastRouteId(), OpenRoutes: m.GetOpenRouteIds(), Unsettled: m.GetUnsettledTickets(), DoneSeq: m.GetDoneSeq(),
	})
	resp, err := c.workerList()
	if err != nil {
		return nil, err
	}
	id, _ := c.node.Leader()
	out := &cartv1.SyncResponse{
		Workers:        resp.Workers,
		WorkersVersion: resp.WorkersVersion,
		BlockChars:     uint32(c.o.BlockChars),
		LeaderId:       id,
		LeaderUrl:      c.st.Members()[id],
	}
	if err := c.checkSyncSize(out); err != nil {
		return nil, err
	}
	return out, nil
}

// checkSyncSize refuses a Sync answer the data planes would refuse to
// read, with the reason, rather than send it (they would only see a
// message too large); past half of that it warns. Nothing else bounds the
// answer: it grows with the workers and their model lists.
func (c *Core) checkSyncSize(m *cartv1.SyncResponse) error {
	n, limit := proto.Size(m), c.o.MaxSyncAnswerBytes
	c.metrics.syncBytes.Set(float64(n))
	if n <= limit/2 {
		return nil
	}
	msg := fmt.Sprintf("the Sync answer (%d workers with their models) is %d bytes; data planes read at most %d", len(m.GetWorkers()), n, limit)
	logIt := c.syncWarned.Allow(c.o.Now(), 10*time.Second)
	if n > limit {
		if logIt {
			c.log.Error(msg + ": data planes cannot sync; remove workers or the models they list")
		}
		return connect.NewError(connect.CodeResourceExhausted, errors.New(msg))
	}
	if logIt {
		c.log.Warn(msg + ": over half the limit")
	}
	return nil
}

// workerList merges the replicated worker set with this node's live
// health and load view.
func (c *Core) workerList() (*cartv1.ListWorkersResponse, error) {
	ws, version := c.st.Workers()
	live := c.dec.Workers()
	limits := c.dec.Concurrencies()
	kv := c.dec.KVStates()
	byURL := make(map[string]engine.WorkerState, len(live))
	for _, w := range live {
		byURL[w.URL] = w
	}
	out := &cartv1.ListWorkersResponse{WorkersVersion: version}
	for _, w := range ws {
		l := byURL[w.URL]
		out.Workers = append(out.Workers, &cartv1.Worker{
			Url: w.URL, MaxLoad: uint32(w.MaxLoad), LoadPenalty: uint32(w.LoadPenalty),
			MaxConcurrency: uint32(w.MaxConcurrency), ConcurrencyLimit: uint32(limits[w.URL]),
			CacheCapacityTokens: w.CacheCapacityTokens, Healthy: l.Healthy, Load: uint32(l.Load),
			PredictedCachedTokens: l.Accuracy.PredictedTokens, ActualCachedTokens: l.Accuracy.ActualTokens,
			CacheMisses: l.Accuracy.Misses, ModelCapacityBlocks: uint32(l.Accuracy.ModelCapacity), Source: w.Source, Draining: l.Draining,
			Models: c.models.IDs(w.URL), Role: w.Role.String(),
		})
		if k := kv[w.URL]; k.On {
			out.Workers[len(out.Workers)-1].KvCache = &cartv1.KVCache{OccupiedTokens: k.OccupiedTokens, CapacityTokens: k.CapacityTokens}
		}
	}
	return out, nil
}
