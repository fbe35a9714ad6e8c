package cpclient

import (
	"errors"
	"strings"

	"connectrpc.com/connect"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// NotLeaderOf returns the NotLeader detail of a control-plane node's
// answer: the node could not serve the call because it is not the leader,
// and names the leader when it knows one. Only an answer from a server
// carries it, so an error made on the client side never does.
func NotLeaderOf(err error) (*cartv1.NotLeader, bool) {
	ce, ok := errors.AsType[*connect.Error](err)
	if !ok || !connect.IsWireError(ce) {
		return nil, false
	}
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			if nl, ok := v.(*cartv1.NotLeader); ok {
				return nl, true
			}
		}
	}
	return nil, false
}

// IsResponseNotFound reports whether err is a Route refusal for a stored
// response of another tenant (NOT_FOUND with a ResponseNotFound detail),
// whether it came in a unary answer or a stream's.
func IsResponseNotFound(err error) bool {
	return HasDetail[*cartv1.ResponseNotFound](err, connect.CodeNotFound)
}

// IsPoolSaturated reports whether err is a Route refusal because every
// eligible worker is at its limit (RESOURCE_EXHAUSTED with a PoolSaturated
// detail), not because none is eligible. Leaders before the detail said so
// only in the message; that is read too, so a data plane upgraded first
// keeps waiting for the queue during a rolling upgrade.
func IsPoolSaturated(err error) bool {
	return HasDetail[*cartv1.PoolSaturated](err, connect.CodeResourceExhausted) ||
		connect.CodeOf(err) == connect.CodeResourceExhausted && strings.Contains(err.Error(), legacySaturated)
}

// legacySaturated is engine.ErrAllSaturated's text as leaders before the
// PoolSaturated detail sent it; fixed here so that rewording the error
// cannot break them.
const legacySaturated = "every usable worker is saturated"

// HasDetail reports whether err is a Connect error with code and a detail
// of type T.
func HasDetail[T any](err error, code connect.Code) bool {
	ce, ok := errors.AsType[*connect.Error](err)
	if !ok || ce.Code() != code {
		return false
	}
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			if _, ok := v.(T); ok {
				return true
			}
		}
	}
	return false
}
