package tracing

import (
	"context"
	"strings"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// Interceptors trace the control-plane API's unary calls, on both sides
// (pass them to a client or to a handler): a client span whose context
// travels in the call's traceparent header, and on the node a server span
// that continues it. Only calls that are part of a trace are traced: a
// client call made outside any span (the data plane's periodic Sync and
// batched Complete), or a call arriving without a traceparent (cartctl,
// probes), passes through untouched, so background traffic never starts a
// trace of its own. Off: nil, to be passed as is to
// connect.WithInterceptors.
func (t *Tracer) Interceptors() []connect.Interceptor {
	if t == nil {
		return nil
	}
	return []connect.Interceptor{&interceptor{t: t}}
}

type interceptor struct{ t *Tracer }

func (i *interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		spec := req.Spec()
		var out connect.AnyResponse
		_, err := i.call(ctx, spec.Procedure, rpcSystem(req.Peer().Protocol), req.Peer().Addr, spec.IsClient,
			propagation.HeaderCarrier(req.Header()), req.Any(), func(ctx context.Context) (any, error) {
				var err error
				if out, err = next(ctx, req); out == nil {
					return nil, err
				}
				return out.Any(), err
			})
		return out, err
	}
}

// StreamCall traces one call carried on a stream (the data plane's Route
// stream) as WrapUnary traces a unary one, the trace context travelling in
// carrier (the message's trace map) instead of headers: on the client side
// it is injected into carrier before next sends the message, on the
// server side extracted from it.
func (i *interceptor) StreamCall(ctx context.Context, procedure, protocol, peer string, client bool, carrier map[string]string, req any, next func(context.Context) (any, error)) (any, error) {
	return i.call(ctx, procedure, rpcSystem(protocol), peer, client, propagation.MapCarrier(carrier), req, next)
}

// call is one traced RPC: only part of a trace when the client side is
// inside a span or the server side received a remote span context.
func (i *interceptor) call(ctx context.Context, procedure, system, peer string, client bool, carrier propagation.TextMapCarrier, req any, next func(context.Context) (any, error)) (any, error) {
	kind := trace.SpanKindClient
	if client {
		if !trace.SpanContextFromContext(ctx).IsValid() {
			return next(ctx)
		}
	} else {
		ctx = i.t.prop.Extract(ctx, carrier)
		if !trace.SpanContextFromContext(ctx).IsRemote() {
			return next(ctx)
		}
		kind = trace.SpanKindServer
	}
	name := strings.TrimPrefix(procedure, "/")
	service, method, _ := strings.Cut(name, "/")
	ctx, sp := i.t.tr.Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(
		attribute.String("rpc.system", system),
		attribute.String("rpc.service", service),
		attribute.String("rpc.method", method),
	))
	defer sp.End()
	if client {
		sp.SetAttributes(attribute.String("server.address", peer))
		i.t.prop.Inject(ctx, carrier)
	}
	if m, ok := req.(*cartv1.RouteRequest); ok && !client {
		sp.SetAttributes(
			attribute.String("cart.dataplane_id", clip(m.GetDataplaneId())),
			attribute.String("cart.endpoint", clip(m.GetEndpoint())),
			attribute.String("cart.model", clip(m.GetModel())),
			attribute.Int("cart.route.blocks", len(m.GetBlockHashes())),
		)
	}
	resp, err := next(ctx)
	if err != nil {
		sp.SetAttributes(attribute.String("rpc.connect_rpc.error_code", connect.CodeOf(err).String()))
		sp.SetStatus(codes.Error, err.Error())
		return resp, err
	}
	if m, ok := resp.(*cartv1.RouteResponse); ok {
		sp.SetAttributes(
			attribute.String("cart.route.worker", m.GetWorker()),
			attribute.String("cart.route.reason", m.GetReason()),
			attribute.Float64("cart.route.matched_ratio", m.GetMatchedRatio()),
			attribute.Bool("cart.route.from_leader", m.GetFromLeader()),
			attribute.String("cart.leader_id", m.GetLeaderId()),
		)
	}
	return resp, nil
}

// A stream itself is not traced (the Route stream lives for hours); the
// calls it carries are, through StreamCall.
func (i *interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i *interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// rpcSystem names the wire protocol as OpenTelemetry's RPC conventions do.
func rpcSystem(protocol string) string {
	switch protocol {
	case connect.ProtocolGRPC, connect.ProtocolGRPCWeb:
		return "grpc"
	}
	return "connect_rpc"
}
