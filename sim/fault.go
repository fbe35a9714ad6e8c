package sim

import (
	"errors"
	"fmt"
	"net/http"
)

// FaultMode selects how a replica misbehaves; see Fault.
type FaultMode string

// Fault modes.
const (
	// FaultNone is normal operation.
	FaultNone FaultMode = "none"
	// FaultDown simulates a dead process: /health answers 503, in-flight
	// requests have their connections cut, and every other request except
	// the /sim/ control endpoints has its connection closed without a
	// response. Cutting needs a real connection: over HTTP/2 the stream is
	// reset, and a handler driven by httptest.ResponseRecorder panics with
	// http.ErrAbortHandler, so test FaultDown through an httptest.Server.
	FaultDown FaultMode = "down"
	// FaultSlow delays every API request by DelayMS before anything else
	// happens (before queueing, so before the first byte).
	FaultSlow FaultMode = "slow"
	// FaultError answers every API request with Status and an error body
	// while /health keeps answering 200, like an engine whose HTTP layer is
	// alive but whose scheduler is wedged. A non-zero DelayMS is applied
	// before the error.
	FaultError FaultMode = "error"
)

// DefaultFaultStatus is the status FaultError uses when Status is 0.
const DefaultFaultStatus = http.StatusServiceUnavailable

// DefaultSlowDelayMS is the delay FaultSlow uses when DelayMS is 0, so that
// {"mode":"slow"} on its own does something visible.
const DefaultSlowDelayMS = 1000

// Fault is the injected failure state of a replica. It is also the JSON body
// of POST /sim/fault: {"mode":"error","status":503,"delay_ms":2000}.
type Fault struct {
	Mode    FaultMode `json:"mode"`
	Status  int       `json:"status,omitempty"`
	DelayMS int       `json:"delay_ms,omitempty"`
}

// normalize validates f and fills in mode-specific defaults.
func (f Fault) normalize() (Fault, error) {
	switch f.Mode {
	case "", FaultNone:
		return Fault{Mode: FaultNone}, nil
	case FaultDown:
		return Fault{Mode: FaultDown}, nil
	case FaultSlow, FaultError:
	default:
		return Fault{}, fmt.Errorf("unknown fault mode %q (want none, down, slow or error)", f.Mode)
	}
	if f.DelayMS < 0 {
		return Fault{}, errors.New("delay_ms must not be negative")
	}
	if f.Mode == FaultSlow {
		if f.DelayMS == 0 {
			f.DelayMS = DefaultSlowDelayMS
		}
		f.Status = 0
		return f, nil
	}
	if f.Status == 0 {
		f.Status = DefaultFaultStatus
	}
	if f.Status < 400 || f.Status > 599 {
		return Fault{}, fmt.Errorf("status must be an HTTP error status (400-599), got %d", f.Status)
	}
	return f, nil
}

// Errors used as context cancellation causes, to tell a replica-side abort
// (which must cut the connection) from a client hang-up (which needs no
// answer at all).
var (
	// ErrClosed is the cause of requests aborted by Server.Close.
	ErrClosed = errors.New("sim: replica closed")
	// ErrDown is the cause of requests aborted by a FaultDown injection.
	ErrDown = errors.New("sim: replica down (injected fault)")
)
