package engine

import "slices"

// Reason says why a worker was chosen.
type Reason string

// Decision reasons. They are metric label values, log fields and the
// RouteResponse.reason of the API: stable. This file is the only place
// their strings are spelled; TestReasonsRegistry fails when a reason is
// defined anywhere else or is missing from the registry or the proto docs.
const (
	ReasonCacheHit      Reason = "cache_hit"
	ReasonCacheMiss     Reason = "cache_miss"
	ReasonHitOverloaded Reason = "hit_overloaded"
	ReasonEmptyText     Reason = "empty_text"
	ReasonSessionHit    Reason = "session_hit"
	// ReasonPD: the request was split between a prefill worker (its own
	// reason is one of the above) and a decode worker (roles.go).
	ReasonPD Reason = "pd"
	// ReasonFallbackLocal is never produced by the Engine: a data plane
	// that cannot reach the control plane decides on its own and says so.
	// It is registered here so that every reason an operator can see is
	// listed in one place.
	ReasonFallbackLocal Reason = "fallback_local"
)

// ReasonInfo is one registered reason and what it means, in one line
// that reads on its own (cartctl route --explain prints it first).
type ReasonInfo struct {
	Reason  Reason
	Meaning string
}

var reasons = []ReasonInfo{
	{ReasonCacheHit, "cache hit: the worker holding the longest cached prefix of the text was chosen"},
	{ReasonCacheMiss, "cache miss: no cached prefix matched well enough, so the least-loaded worker was chosen"},
	{ReasonHitOverloaded, "cache hit, but overloaded: the worker holding the prefix was too busy, so the least-loaded worker was chosen"},
	{ReasonEmptyText, "empty text: there was no key text to match on, so the least-loaded worker was chosen"},
	{ReasonSessionHit, "session hit: the request's session stuck to the worker that served it before"},
	{ReasonPD, "prefill/decode: a prefill worker chosen by prefix computes the prompt and hands its KV cache to the least-loaded decode worker"},
	{ReasonFallbackLocal, "local fallback: the control plane was unreachable, so the data plane chose by its own counts"},
}

// Reasons returns every decision reason, in a stable order.
func Reasons() []ReasonInfo { return slices.Clone(reasons) }

// Meaning returns the registered one-line meaning of r, and false for a
// reason this build does not know (a newer control plane may send one).
func (r Reason) Meaning() (string, bool) {
	i := slices.IndexFunc(reasons, func(ri ReasonInfo) bool { return ri.Reason == r })
	if i < 0 {
		return "", false
	}
	return reasons[i].Meaning, true
}
