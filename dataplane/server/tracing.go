package server

import (
	"log/slog"

	"github.com/cartrouter/cart/internal/tracing"
)

// Option adjusts what NewAllInOne and NewDataPlane build beyond what the
// config says (the control-plane daemon takes the same options).
type Option = tracing.Option

// WithTracer makes the server trace with t (nil: not at all) instead of
// the tracer tracing.* describes. The caller keeps t and shuts it down.
func WithTracer(t *tracing.Tracer) Option { return tracing.WithTracer(t) }

// closeTracer flushes an owned tracer's last spans at the end of a Run.
func closeTracer(t *tracing.Tracer, log *slog.Logger) {
	if err := t.Close(); err != nil {
		log.Warn("tracing shutdown", "error", err.Error())
	}
}
