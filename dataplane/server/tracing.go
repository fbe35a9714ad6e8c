package server

import (
	"log/slog"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/internal/tracing"
)

// Option adjusts what NewAllInOne, NewDataPlane and the control-plane
// daemon build beyond what the config says.
type Option func(*buildOptions)

type buildOptions struct {
	tracer    *tracing.Tracer
	hasTracer bool
}

// WithTracer makes the server trace with t (nil: not at all) instead of
// the tracer tracing.* describes. The caller keeps t and shuts it down.
func WithTracer(t *tracing.Tracer) Option {
	return func(o *buildOptions) { o.tracer, o.hasTracer = t, true }
}

// Tracer is the tracer a role traces with: the one passed WithTracer, else
// the one tracing.* describes, which the role then owns (owned: its Run
// shuts it down, flushing the last spans, after the listener has drained).
func Tracer(cfg *config.Config, role config.Role, instanceID string, opts []Option, log *slog.Logger) (t *tracing.Tracer, owned bool, err error) {
	var o buildOptions
	for _, fn := range opts {
		fn(&o)
	}
	if o.hasTracer {
		return o.tracer, false, nil
	}
	t, err = tracing.New(cfg.Tracing, role, instanceID)
	if t != nil {
		tracing.LogErrors(log)
	}
	return t, t != nil, err
}

// closeTracer flushes an owned tracer's last spans at the end of a Run.
func closeTracer(t *tracing.Tracer, log *slog.Logger) {
	if err := t.Close(); err != nil {
		log.Warn("tracing shutdown", "error", err.Error())
	}
}
