package tracing

import (
	"log/slog"

	"github.com/cartrouter/cart/config"
)

// Option adjusts what a role (all-in-one, data plane, control-plane node)
// builds beyond what the config says.
type Option func(*buildOptions)

type buildOptions struct {
	tracer    *Tracer
	hasTracer bool
}

// WithTracer makes a role trace with t (nil: not at all) instead of the
// tracer tracing.* describes. The caller keeps t and shuts it down.
func WithTracer(t *Tracer) Option {
	return func(o *buildOptions) { o.tracer, o.hasTracer = t, true }
}

// ForRole is the tracer a role traces with: the one passed WithTracer, else
// the one tracing.* describes, which the role then owns (owned: its Run
// shuts it down, flushing the last spans, after the listener has drained).
func ForRole(cfg *config.Config, role config.Role, instanceID string, opts []Option, log *slog.Logger) (t *Tracer, owned bool, err error) {
	var o buildOptions
	for _, fn := range opts {
		fn(&o)
	}
	if o.hasTracer {
		return o.tracer, false, nil
	}
	t, err = New(cfg.Tracing, role, instanceID)
	if t != nil {
		LogErrors(log)
	}
	return t, t != nil, err
}
