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

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// RouterHandler implements cartv1connect.RouterServiceHandler.
type RouterHandler struct{ c *Core }

// Router returns the RouterService handler.
func (c *Core) Router() *RouterHandler { return &RouterHandler{c} }

// maxSessionKey is the longest session key kept as is. Data planes send a
// 32-character hash; a longer key is hashed here, before the routing lock,
// so that hashing it inside the engine costs nothing.
const maxSessionKey = 64

// Route implements RouterService.Route.
func (h *RouterHandler) Route(ctx context.Context, req *connect.Request[cartv1.RouteRequest]) (*connect.Response[cartv1.RouteResponse], error) {
	c := h.c
	if !c.node.IsLeader() {
		url, err := c.leaderURL(req.Header())
		if err != nil {
			return nil, err
		}
		return c.fwd.routerTo(url).Route(ctx, connect.NewRequest(req.Msg))
	}
	start := time.Now()
	m := req.Msg
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
	exclude := m.GetExcludeWorkers()
	if ex, err := c.models.Exclude(m.GetModel()); err != nil {
		return nil, connect.NewError(connect.CodeNotFound, err)
	} else if len(ex) > 0 {
		exclude = append(slices.Clip(exclude), ex...)
	}
	now := c.o.Now()
	c.mu.Lock()
	if !c.leading {
		c.mu.Unlock()
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("leader is still catching up (barrier pending)"))
	}
	exclude, pinned, gone := c.pinResponse(m.GetResponseIdHash(), exclude, now)
	if gone != "" {
		c.mu.Unlock()
		// Not NotFound, which says "model not served": the data plane must
		// tell the two apart to answer the client the right error.
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("the worker that produced this response (%s) is no longer in the pool", gone))
	}
	d, err := c.eng.Route(engine.Request{Hashes: hashes, KeyLen: keyLen, Exclude: exclude, DryRun: m.GetDryRun(), Session: session}, now.UnixNano())
	var tk uint64
	var placed []uint64
	if err == nil && !m.GetDryRun() {
		if ctx.Err() != nil {
			// The caller's deadline passed while this waited for the
			// lock or decided: it has routed elsewhere and will never
			// settle this decision. Undo it before anyone sees it.
			c.eng.Release(d.Worker)
			c.eng.Unplace(d)
			c.mu.Unlock()
			c.metrics.ticketsDropped.WithLabelValues(dropAbandoned).Inc()
			return nil, connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
		}
		placed = slices.Clone(d.Placed)
		tk = c.issue(&ticket{dp: m.GetDataplaneId(), route: m.GetRouteId(), worker: d.Worker, placed: placed, at: now,
			keyLen: keyLen, predicted: d.ChosenChars, placedAgo: d.PlacedAgo})
		dp := c.dataPlane(m.GetDataplaneId(), now)
		dp.loads[d.Worker]++
		if len(placed) > 0 {
			// Under the engine lock: the batcher's ledger moves with the index.
			c.batch.Place(d.Worker, placed, now)
		}
	}
	c.mu.Unlock()
	if err != nil {
		return nil, capacityError(err)
	}
	elapsed := time.Since(start)
	c.metrics.routes.WithLabelValues(string(d.Reason)).Inc()
	c.metrics.routeTime.Observe(elapsed.Seconds())
	id, _ := c.node.Leader()
	return connect.NewResponse(&cartv1.RouteResponse{
		Worker:         d.Worker,
		Reason:         string(d.Reason),
		MatchedChars:   uint32(d.MatchedChars),
		MatchedRatio:   d.MatchedRatio,
		DecisionMicros: elapsed.Microseconds(),
		FromLeader:     true,
		Candidate:      d.Candidate,
		ChosenChars:    uint32(d.ChosenChars),
		Ticket:         tk,
		LeaderId:       id,
		Pinned:         pinned,
	}), nil
}

// pinResponse resolves a request for a stored response: when this leader
// learned which worker produced it, every other worker is excluded (the
// response lives on that one only; load and prefix do not matter). gone
// names that worker when it has left the pool. c.mu must be held.
func (c *Core) pinResponse(hash uint64, exclude []string, now time.Time) (_ []string, pinned bool, gone string) {
	if hash == 0 {
		return exclude, false, ""
	}
	w, ok := c.responses.Lookup(hash, now)
	if !ok {
		return exclude, false, "" // never seen (or forgotten): routed like any request
	}
	if _, known := c.eng.WorkerIDOf(w); !known {
		return nil, false, w
	}
	out := slices.Clone(exclude)
	for _, ws := range c.eng.Workers() {
		if ws.URL != w {
			out = append(out, ws.URL)
		}
	}
	return out, true, ""
}

// capacityError maps "nobody can take this" to ResourceExhausted, which
// data planes pass on as 503 instead of falling back: the control plane
// answered, and the answer is that the pool is full or down.
func capacityError(err error) error {
	switch {
	case errors.Is(err, engine.ErrNoWorkers), errors.Is(err, engine.ErrNoHealthy),
		errors.Is(err, engine.ErrAllExcluded), errors.Is(err, engine.ErrAllSaturated):
		return connect.NewError(connect.CodeResourceExhausted, err)
	}
	return connect.NewError(connect.CodeInternal, err)
}

// dataPlane returns (creating) a data plane's record; mu must be held.
func (c *Core) dataPlane(id string, now time.Time) *dataPlane {
	dp, ok := c.dps[id]
	if !ok {
		dp = &dataPlane{loads: map[string]int{}}
		c.dps[id] = dp
	}
	dp.lastSeen = now
	return dp
}

// Complete implements RouterService.Complete.
func (h *RouterHandler) Complete(ctx context.Context, req *connect.Request[cartv1.CompleteRequest]) (*connect.Response[cartv1.CompleteResponse], error) {
	c := h.c
	if !c.node.IsLeader() {
		url, err := c.leaderURL(req.Header())
		if err != nil {
			return nil, err
		}
		return c.fwd.routerTo(url).Complete(ctx, connect.NewRequest(req.Msg))
	}
	now := c.o.Now()
	var settled uint32
	dpID := req.Msg.GetDataplaneId()
	c.mu.Lock()
	for _, o := range req.Msg.GetResponseOrigins() {
		if o.GetIdHash() != 0 && o.GetWorker() != "" {
			c.responses.Learn(o.GetIdHash(), o.GetWorker(), now)
			// Replicated with the placements, so a new leader keeps it.
			c.batch.Origin(&cartv1.ResponseOrigin{IdHash: o.GetIdHash(), Worker: o.GetWorker()})
		}
	}
	c.dataPlane(dpID, now)
	for _, comp := range req.Msg.GetCompletions() {
		if comp.GetAbandoned() {
			// The data plane never used this decision: it knows only the
			// id of the call it gave up on.
			id, ok := c.byRoute[routeKey{dpID, comp.GetRouteId()}]
			if !ok || comp.GetRouteId() == 0 {
				continue // undone when its deadline passed, or never decided
			}
			c.settle(id, false, true)
			settled++
			c.metrics.ticketsDropped.WithLabelValues(dropAbandoned).Inc()
			continue
		}
		tk, ok := c.tickets[comp.GetTicket()]
		if !ok || tk.worker != comp.GetWorker() || tk.dp != dpID {
			continue // settled already, or issued by an earlier leader: Sync reconciles the load
		}
		c.settle(comp.GetTicket(), comp.GetDelivered(), true)
		settled++
		if comp.GetDelivered() && comp.GetPromptTokens() > 0 && comp.GetCachedTokens() >= 0 {
			c.eng.Feedback(tk.worker, tk.keyLen, tk.predicted, tk.placedAgo, int(comp.GetPromptTokens()), int(comp.GetCachedTokens()))
		}
	}
	c.mu.Unlock()
	return connect.NewResponse(&cartv1.CompleteResponse{Settled: settled}), nil
}

// Sync implements RouterService.Sync: the data plane's absolute in-flight
// counts replace what the leader had for it (reconciling drift both ways),
// and the answer carries the worker set with live health and load.
func (h *RouterHandler) Sync(ctx context.Context, req *connect.Request[cartv1.SyncRequest]) (*connect.Response[cartv1.SyncResponse], error) {
	c := h.c
	if !c.node.IsLeader() {
		url, err := c.leaderURL(req.Header())
		if err != nil {
			return nil, err
		}
		return c.fwd.routerTo(url).Sync(ctx, connect.NewRequest(req.Msg))
	}
	now := c.o.Now()
	reported := make(map[string]int, len(req.Msg.GetLoads()))
	for _, l := range req.Msg.GetLoads() {
		reported[l.GetWorker()] = int(l.GetInFlight())
	}
	_, version := c.st.Workers() // before c.mu: the state shares that lock
	c.mu.Lock()
	c.rebuildLoads(version)
	dp := c.dataPlane(req.Msg.GetDataplaneId(), now)
	dp.fallbacks += req.Msg.GetFallbacks()
	for w, n := range dp.loads {
		if _, ok := reported[w]; !ok {
			c.eng.AdjustLoad(w, -n)
			delete(dp.loads, w)
		}
	}
	for w, n := range reported {
		if _, known := c.eng.WorkerIDOf(w); !known {
			// Removed (or not yet added): nothing to account it to.
			c.eng.AdjustLoad(w, -dp.loads[w])
			delete(dp.loads, w)
			continue
		}
		c.eng.AdjustLoad(w, n-dp.loads[w])
		dp.loads[w] = n
	}
	c.mu.Unlock()
	resp, err := c.workerList()
	if err != nil {
		return nil, err
	}
	id, _ := c.node.Leader()
	return connect.NewResponse(&cartv1.SyncResponse{
		Workers:        resp.Workers,
		WorkersVersion: resp.WorkersVersion,
		BlockChars:     uint32(c.o.BlockChars),
		LeaderId:       id,
		LeaderUrl:      c.st.Members()[id],
	}), nil
}

// rebuildLoads recomputes the engine's load view from the data planes'
// counts after the worker set changed: a worker removed and added again
// comes back with load 0 in the engine while data planes still count
// requests on it. c.mu must be held.
func (c *Core) rebuildLoads(version uint64) {
	if version == c.loadsVersion {
		return
	}
	c.loadsVersion = version
	c.eng.ResetLoads()
	for _, dp := range c.dps {
		for w, n := range dp.loads {
			if _, known := c.eng.WorkerIDOf(w); known {
				c.eng.AdjustLoad(w, n)
			} else {
				delete(dp.loads, w)
			}
		}
	}
}

// workerList merges the replicated worker set with this node's live
// health and load view.
func (c *Core) workerList() (*cartv1.ListWorkersResponse, error) {
	ws, version := c.st.Workers()
	c.mu.Lock()
	live := c.eng.Workers()
	kv := make(map[string]engine.KVState, len(live))
	for _, w := range live {
		kv[w.URL] = c.eng.KV(w.URL)
	}
	c.mu.Unlock()
	byURL := make(map[string]engine.WorkerState, len(live))
	for _, w := range live {
		byURL[w.URL] = w
	}
	out := &cartv1.ListWorkersResponse{WorkersVersion: version}
	for _, w := range ws {
		l := byURL[w.URL]
		out.Workers = append(out.Workers, &cartv1.Worker{
			Url: w.URL, MaxLoad: uint32(w.MaxLoad), LoadPenalty: uint32(w.LoadPenalty),
			CacheCapacityTokens: w.CacheCapacityTokens, Healthy: l.Healthy, Load: uint32(l.Load),
			PredictedCachedTokens: l.Accuracy.PredictedTokens, ActualCachedTokens: l.Accuracy.ActualTokens,
			CacheMisses: l.Accuracy.Misses, ModelCapacityBlocks: uint32(l.Accuracy.ModelCapacity), Source: w.Source, Draining: l.Draining,
			Models: c.models.IDs(w.URL),
		})
		if k := kv[w.URL]; k.On {
			out.Workers[len(out.Workers)-1].KvCache = &cartv1.KVCache{OccupiedTokens: k.OccupiedTokens, CapacityTokens: k.CapacityTokens}
		}
	}
	return out, nil
}
