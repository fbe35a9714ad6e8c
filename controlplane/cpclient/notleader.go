package cpclient

import (
	"errors"

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
	ce, ok := errors.AsType[*connect.Error](err)
	if !ok || ce.Code() != connect.CodeNotFound {
		return false
	}
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			if _, ok := v.(*cartv1.ResponseNotFound); ok {
				return true
			}
		}
	}
	return false
}
