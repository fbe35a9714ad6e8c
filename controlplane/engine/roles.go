package engine

import (
	"errors"
	"fmt"

	"github.com/cartrouter/cart/controlplane/index"
)

// ---- prefill/decode roles ----------------------------------------------------
//
// A split pool has prefill workers, which compute a prompt's KV cache and
// hand it over (vLLM's NIXL connector), and decode workers, which receive
// it and generate; `both` workers serve whole requests. A request that may
// be split (Request.Disagg) gets a pair: the prefill worker chosen as any
// request is, cache-aware among the prefill workers (it is the one that
// computes the prompt, so it is where a cached prefix saves work, and it
// holds the placement), and the decode worker least loaded among the
// decode workers with room. Either leg's worker takes a unit of load of its
// own, given back by its own release.
//
// A request goes whole to one worker instead when
//   - its uncached prompt is short (Policy.PDThresholdTokens, as llm-d's
//     pd-profile-handler threshold): computing it where it is decoded costs
//     less than a KV transfer (WholeShortPrompt);
//   - no prefill worker, or no decode worker, can take it (down, excluded
//     after failing this request): a `both` worker takes it whole, or, in a
//     pool without one in service, a decode worker, which computes the
//     prompt itself as vLLM and llm-d's decode instances do for a request
//     without kv_transfer_params (WholeNoPrefill, WholeNoDecode). A prefill
//     side that is merely saturated in such a pool makes the request wait
//     for a slot instead (flow control): spilling prefill work onto the
//     decode workers would slow every stream they carry.
//
// Whole requests go to `both` workers, or to decode workers when no `both`
// worker is in service; prefill workers never get one.

// Role is the part of requests a worker serves.
type Role uint8

// Worker roles. RoleBoth is the zero value: a worker configured without a
// role serves whole requests, as every worker did before roles.
const (
	RoleBoth Role = iota
	RolePrefill
	RoleDecode
)

var roleNames = [...]string{RoleBoth: "both", RolePrefill: "prefill", RoleDecode: "decode"}

func (r Role) String() string {
	if int(r) < len(roleNames) {
		return roleNames[r]
	}
	return fmt.Sprintf("Role(%d)", r)
}

// ParseRole reads a role's name; "" is RoleBoth.
func ParseRole(s string) (Role, error) {
	if s == "" {
		return RoleBoth, nil
	}
	for r, n := range roleNames {
		if n == s {
			return Role(r), nil
		}
	}
	return RoleBoth, fmt.Errorf("unknown worker role %q: want both, prefill or decode", s)
}

// RoleMask is a set of roles.
type RoleMask uint8

// Role sets.
const (
	MaskBoth    RoleMask = 1 << RoleBoth
	MaskPrefill RoleMask = 1 << RolePrefill
	MaskDecode  RoleMask = 1 << RoleDecode
	AllRoles             = MaskBoth | MaskPrefill | MaskDecode
)

// Has reports whether r is in m.
func (m RoleMask) Has(r Role) bool { return m&(1<<r) != 0 }

// Disagg says how a request may be split between workers.
type Disagg uint8

const (
	// DisaggNone routes the request whole (the zero value).
	DisaggNone Disagg = iota
	// DisaggPair asks for a prefill worker and a decode worker (the
	// Decision's Prefill and Worker), or routes whole when the pool is not
	// split or the rules above say so (Decision.Whole).
	DisaggPair
	// DisaggDecode asks for a decode worker only: the request's prefill
	// is done and its KV cache waits on the prefill worker (a decode leg
	// sent again after its first decode worker refused it).
	DisaggDecode
)

// Why a request that could have been split went whole (Decision.Whole).
const (
	WholeShortPrompt = "short_prompt"
	WholeNoPrefill   = "no_prefill"
	WholeNoDecode    = "no_decode"
)

// WholeRoles is the role set whole requests go to: `both` workers when one
// is in service, else `both` and decode workers. bothInService says whether
// a `both` worker is healthy and not draining. Data planes' local fallback
// applies it too.
func WholeRoles(bothInService bool) RoleMask {
	if bothInService {
		return MaskBoth
	}
	return MaskBoth | MaskDecode
}

// aggregatedRoles is the role set req may go to whole.
func (e *Engine) aggregatedRoles(req Request) RoleMask {
	if req.AnyRole {
		return AllRoles
	}
	return WholeRoles(e.inService(RoleBoth))
}

// inService reports whether a worker of role r is healthy and not
// draining.
func (e *Engine) inService(r Role) bool {
	for _, w := range e.workers {
		if w.spec.Role == r && w.healthy && !w.draining {
			return true
		}
	}
	return false
}

// Split reports whether the pool has both a prefill and a decode worker
// (whatever their health): whether disaggregation applies at all.
func (e *Engine) Split() bool {
	var m RoleMask
	for _, w := range e.workers {
		m |= 1 << w.spec.Role
	}
	return m&MaskPrefill != 0 && m&MaskDecode != 0
}

// routePair decides a request that may be split (package comment above).
func (e *Engine) routePair(req Request, now int64) (Decision, error) {
	if req.AnyRole || !e.Split() {
		return e.routeWhole(req, now, e.aggregatedRoles(req), "")
	}
	whole := e.aggregatedRoles(req)
	if t := e.pol.PDThresholdTokens; t > 0 {
		if c, err := e.pickAmong(req, whole, now); err == nil && uncachedTokens(req, c.d) < t {
			e.commit(&c, req, now, true)
			c.d.Whole = WholeShortPrompt
			return c.d, nil
		}
	}
	pre, perr := e.pickAmong(req, MaskPrefill, now)
	var dec choice
	var derr error
	if perr == nil {
		dec, derr = e.pickAmong(decodeOnly(req), MaskDecode, now)
	}
	if perr == nil && derr == nil {
		e.commit(&pre, req, now, true)
		e.commit(&dec, req, now, false)
		d := dec.d
		d.Reason = ReasonPD
		// The pair's match is the prefill worker's: the decode worker is
		// sent the computed cache.
		d.MatchedChars, d.MatchedRatio, d.HotChars = pre.d.MatchedChars, pre.d.MatchedRatio, pre.d.HotChars
		d.AvoidIgnored = pre.d.AvoidIgnored || dec.d.AvoidIgnored
		p := pre.d
		d.Prefill = &p
		return d, nil
	}
	if errors.Is(perr, ErrAllSaturated) && whole.Has(RoleDecode) {
		// No `both` worker is in service, so only decode workers could
		// take it whole: wait for a prefill slot rather than load them
		// with prefill work.
		return Decision{}, perr
	}
	why := WholeNoPrefill
	if perr == nil {
		why = WholeNoDecode
	}
	d, err := e.routeWhole(req, now, whole, why)
	if err != nil && (errors.Is(perr, ErrAllSaturated) || errors.Is(derr, ErrAllSaturated)) {
		// Some leg only lacked room: the request waits for it.
		return Decision{}, ErrAllSaturated
	}
	return d, err
}

// routeWhole routes req whole to a worker of roles.
func (e *Engine) routeWhole(req Request, now int64, roles RoleMask, why string) (Decision, error) {
	c, err := e.pickAmong(req, roles, now)
	if err != nil {
		return Decision{}, err
	}
	e.commit(&c, req, now, true)
	c.d.Whole = why
	return c.d, nil
}

// routeDecode picks a decode worker for a request whose prefill is done.
func (e *Engine) routeDecode(req Request, now int64) (Decision, error) {
	c, err := e.pickAmong(decodeOnly(req), MaskDecode, now)
	if err != nil {
		return Decision{}, err
	}
	e.commit(&c, req, now, false)
	c.d.Reason = ReasonPD
	return c.d, nil
}

// decodeOnly is req as the decode leg sees it: no prompt to match (the
// decode worker is sent the computed cache, and holds no placement), no
// session (sessions follow the prompt's cache, on the prefill side).
func decodeOnly(req Request) Request {
	req.Hashes, req.KeyLen, req.Session = nil, 0, ""
	return req
}

// uncachedTokens estimates the prompt tokens of req that d's worker does
// not hold.
func uncachedTokens(req Request, d Decision) int {
	return max(req.KeyLen-d.ChosenChars, 0) / index.CharsPerToken
}
