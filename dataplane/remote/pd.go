package remote

import (
	"time"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/dataplane/router"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// Prefill/decode on a data plane: the leader's answer carries both legs of
// a split decision (RouteResponse.prefill, with its own ticket), and while
// no leader answers the data plane splits requests itself, by the
// engine's rules (controlplane/engine/roles.go) over its own counts: the
// prefill worker by the shadow index's match, the decode worker least
// loaded. The local fallback has no threshold (disaggregation.
// threshold_tokens is the control plane's): it splits every request it
// may split.

// prefillLeg is a leader's prefill leg as a decision of its own.
func prefillLeg(p *cartv1.PrefillLeg, latency time.Duration, fromLeader bool) *router.Decision {
	if p == nil {
		return nil
	}
	return &router.Decision{Worker: p.GetWorker(), Reason: p.GetReason(), MatchedChars: int(p.GetMatchedChars()), MatchedRatio: p.GetMatchedRatio(),
		Candidate: p.GetCandidate(), ChosenChars: int(p.GetChosenChars()), Latency: latency, FromLeader: fromLeader,
		Ticket: router.Ticket{ID: p.GetTicket(), Worker: p.GetWorker()}}
}

// placedOn is the worker a decision's prompt was placed on: the prefill
// worker's of a split one.
func placedOn(d router.Decision) string {
	if d.Prefill != nil {
		return d.Prefill.Worker
	}
	return d.Worker
}

// choosePairLocked is the fallback's decision, split when the request may
// be and the pool is, without taking load. r.mu held.
func (r *Router) choosePairLocked(req *router.Request) (_ router.Decision, full bool, _ error) {
	whole := engine.WholeRoles(r.inServiceLocked(engine.RoleBoth))
	if req.Disagg == engine.DisaggDecode {
		d, full, err := r.chooseLocked(decodeOnly(req), engine.MaskDecode)
		return d, full, err
	}
	if req.Disagg != engine.DisaggPair || !r.splitLocked() {
		return r.chooseLocked(req, whole)
	}
	pre, pfull, perr := r.chooseLocked(req, engine.MaskPrefill)
	var dfull bool
	var derr error
	if perr == nil {
		var dec router.Decision
		dec, dfull, derr = r.chooseLocked(decodeOnly(req), engine.MaskDecode)
		if derr == nil {
			dec.MatchedChars, dec.MatchedRatio = pre.MatchedChars, pre.MatchedRatio
			dec.AvoidIgnored = dec.AvoidIgnored || pre.AvoidIgnored
			dec.Prefill = &pre
			return dec, false, nil
		}
	}
	if pfull && whole.Has(engine.RoleDecode) {
		// As the engine: with no both worker in service, a prefill side
		// that only lacks room is waited for, not spilled onto decode.
		return router.Decision{}, true, perr
	}
	d, full, err := r.chooseLocked(req, whole)
	if err != nil {
		return d, full || pfull || dfull, err
	}
	d.Whole = engine.WholeNoPrefill
	if perr == nil {
		d.Whole = engine.WholeNoDecode
	}
	return d, false, nil
}

// decodeOnly is req as its decode leg is chosen: by load alone.
func decodeOnly(req *router.Request) *router.Request {
	c := *req
	c.Hashes, c.KeyLen, c.Session = nil, 0, ""
	return &c
}

// inServiceLocked reports whether a worker of role is healthy and not
// draining. r.mu held.
func (r *Router) inServiceLocked(role engine.Role) bool {
	for _, w := range r.workers {
		if w.Role == role && w.Healthy && !w.Draining {
			return true
		}
	}
	return false
}

// splitLocked reports whether the pool has prefill and decode workers.
// r.mu held.
func (r *Router) splitLocked() bool {
	var m engine.RoleMask
	for _, w := range r.workers {
		m |= 1 << w.Role
	}
	return m.Has(engine.RolePrefill) && m.Has(engine.RoleDecode)
}
