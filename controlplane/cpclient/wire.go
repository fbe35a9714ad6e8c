package cpclient

import (
	"context"

	"connectrpc.com/connect"
)

// Wire constants of the control-plane API, shared by its server
// (controlplane/service) and every client (data planes, cartctl,
// followers forwarding, joining nodes, cart-probe). They live here, in the
// package clients already import, so a client never links the server with
// Raft and its storage to learn a header name.
const (
	// HeaderWriteOutcome is set to "unknown" on a write's error when the
	// control plane cannot tell whether the write took effect (the code is
	// then Aborted). Commands are idempotent: the client repeats the call,
	// on any member, until it gets a definite answer.
	HeaderWriteOutcome = "Cart-Write-Outcome"
	// HeaderLeaderURL carries the leader's API URL on errors from
	// followers, so clients can go straight to the leader next time.
	HeaderLeaderURL = "Cart-Leader-Url"
	// HeaderForwarded marks a call a follower forwarded to the leader, so
	// a stale leader view can never bounce a call around the cluster.
	HeaderForwarded = "Cart-Forwarded"
	// HeaderActor carries the actor of an admin call a follower forwards
	// to the leader, so the replicated command names who asked, not the
	// follower. It is taken from callers that already passed
	// authentication, and it only labels the audit log; nothing is
	// authorised by it.
	HeaderActor = "Cart-Actor"
	// HeaderAuthorization carries the cluster or admin token as
	// "Bearer <token>".
	HeaderAuthorization = "Authorization"
	// OutcomeUnknown is HeaderWriteOutcome's value when the write may or
	// may not have taken effect.
	OutcomeUnknown = "unknown"
	// MaxMessageBytes bounds every request message the control plane
	// reads (the server refuses larger ones; cartctl refuses to send them).
	MaxMessageBytes = 4 << 20
	// MaxAnswerBytes bounds every message a CART client (data plane,
	// forwarding follower, joining node, cartctl, the container probe)
	// reads from a control-plane node. The largest legitimate ones are a
	// Sync answer and a ListWorkers answer: every worker with its state
	// and its model ids. Nothing
	// bounds that as a whole (workers come from config, AddWorker calls
	// and discovery; each one's models from its /v1/models, read up to
	// 8 MiB), so this is a judgement: 1,000 workers serving 100 adapters
	// of 64-character names each come to about 6.5 MiB, so the bound
	// leaves room for about 10,000 such workers. Stream messages stay far
	// below it (answer batches and feed frames stop at 1 MiB, beyond which
	// only a single answer or placement goes alone).
	MaxAnswerBytes = 64 << 20
)

// Bearer is the interceptor every control-plane client authenticates
// with: it sends token as "Authorization: Bearer <token>" on each call,
// unary and streaming. An empty token sends nothing (a loopback or
// unauthenticated cluster).
//
// It acts on the client side only (Spec().IsClient), so installing it on a
// handler is harmless: the server authenticates in an HTTP middleware
// (service.Handler) because a Connect interceptor on a unary handler runs
// only after the request message was read, and an unauthenticated caller
// must not make a node buffer and decode up to the message limit. The
// server shares the header's parsing instead (internal/credential).
func Bearer(token string) connect.Interceptor { return bearer{value: bearerValue(token)} }

func bearerValue(token string) string {
	if token == "" {
		return ""
	}
	return "Bearer " + token
}

type bearer struct{ value string }

func (b bearer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if b.value != "" && req.Spec().IsClient {
			req.Header().Set(HeaderAuthorization, b.value)
		}
		return next(ctx, req)
	}
}

func (b bearer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		if b.value != "" {
			conn.RequestHeader().Set(HeaderAuthorization, b.value)
		}
		return conn
	}
}

func (b bearer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// StreamTracer traces one call carried on the Route stream as an
// interceptor traces a unary call, the trace context travelling in
// carrier (the stream message's trace map). tracing's interceptor
// implements it; client and server find it among their interceptors.
type StreamTracer interface {
	StreamCall(ctx context.Context, procedure, protocol, peer string, client bool, carrier map[string]string, req any, next func(context.Context) (any, error)) (any, error)
}

// FindStreamTracer returns the first interceptor that traces stream calls,
// or nil.
func FindStreamTracer(interceptors []connect.Interceptor) StreamTracer {
	for _, i := range interceptors {
		if t, ok := i.(StreamTracer); ok {
			return t
		}
	}
	return nil
}
