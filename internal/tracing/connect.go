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
		kind := trace.SpanKindClient
		if spec.IsClient {
			if !trace.SpanContextFromContext(ctx).IsValid() {
				return next(ctx, req)
			}
		} else {
			ctx = i.t.prop.Extract(ctx, propagation.HeaderCarrier(req.Header()))
			if !trace.SpanContextFromContext(ctx).IsRemote() {
				return next(ctx, req)
			}
			kind = trace.SpanKindServer
		}
		name := strings.TrimPrefix(spec.Procedure, "/")
		service, method, _ := strings.Cut(name, "/")
		ctx, sp := i.t.tr.Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(
			attribute.String("rpc.system", rpcSystem(req.Peer().Protocol)),
			attribute.String("rpc.service", service),
			attribute.String("rpc.method", method),
		))
		defer sp.End()
		if spec.IsClient {
			sp.SetAttributes(attribute.String("server.address", req.Peer().Addr))
			i.t.prop.Inject(ctx, propagation.HeaderCarrier(req.Header()))
		}
		if m, ok := req.Any().(*cartv1.RouteRequest); ok && !spec.IsClient {
			sp.SetAttributes(
				attribute.String("cart.dataplane_id", clip(m.GetDataplaneId())),
				attribute.String("cart.endpoint", clip(m.GetEndpoint())),
				attribute.String("cart.model", clip(m.GetModel())),
				attribute.Int("cart.route.blocks", len(m.GetBlockHashes())),
			)
		}
		resp, err := next(ctx, req)
		if err != nil {
			sp.SetAttributes(attribute.String("rpc.connect_rpc.error_code", connect.CodeOf(err).String()))
			sp.SetStatus(codes.Error, err.Error())
			return resp, err
		}
		if m, ok := resp.Any().(*cartv1.RouteResponse); ok {
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
}

// Streaming calls are not traced per message: the Route stream (one per
// data plane, carrying every route) would make one span of hours. The
// proxy's cart.route span still times each decision.
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
