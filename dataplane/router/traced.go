package router

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/cartrouter/cart/internal/tracing"
)

// Traced traces every Route call of r as a cart.route span carrying
// the decision (worker, reason, matched ratio and characters, candidate,
// whether the leader or a local fallback decided). A remote router's call
// to the control plane runs inside it, so its client span is the route
// span's child. Tracing off (t nil): r itself.
func Traced(t *tracing.Tracer, r Router) Router {
	if t == nil {
		return r
	}
	tr := &tracedRouter{Router: r, t: t}
	if l, ok := r.(ResponseLearner); ok {
		// The proxy looks for ResponseLearner on its router: keep it
		// visible through the wrapper, and absent when r lacks it.
		return &tracedLearner{tracedRouter: tr, l: l}
	}
	return tr
}

type tracedRouter struct {
	Router
	t *tracing.Tracer
}

func (r *tracedRouter) Decide(ctx context.Context, req *Request) (Decision, error) {
	ctx, sp := r.t.StartSpan(ctx, tracing.SpanRoute, trace.WithAttributes(
		attribute.Int("cart.route.excluded", len(req.Exclude)),
		attribute.Int("cart.route.blocks", len(req.Hashes)),
	))
	defer sp.End()
	d, err := r.Router.Decide(ctx, req)
	if err != nil {
		sp.SetStatus(codes.Error, err.Error())
		return d, err
	}
	sp.SetAttributes(
		attribute.String("cart.route.worker", d.Worker),
		attribute.String("cart.route.reason", d.Reason),
		attribute.Float64("cart.route.matched_ratio", d.MatchedRatio),
		attribute.Int("cart.route.matched_chars", d.MatchedChars),
		attribute.String("cart.route.candidate", d.Candidate),
		attribute.Bool("cart.route.from_leader", d.FromLeader),
		attribute.Bool("cart.route.pinned", d.Pinned),
	)
	return d, nil
}

type tracedLearner struct {
	*tracedRouter
	l ResponseLearner
}

func (r *tracedLearner) LearnResponse(ctx context.Context, id, worker, tenant string) {
	r.l.LearnResponse(ctx, id, worker, tenant)
}
