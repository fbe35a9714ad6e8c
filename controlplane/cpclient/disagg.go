package cpclient

import (
	"github.com/cartrouter/cart/controlplane/engine"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// disaggs pairs RouteRequest.disaggregation's values with the engine's.
var disaggs = [...]struct {
	e engine.Disagg
	w cartv1.Disaggregation
}{
	{engine.DisaggNone, cartv1.Disaggregation_DISAGGREGATION_UNSPECIFIED},
	{engine.DisaggPair, cartv1.Disaggregation_DISAGGREGATION_PAIR},
	{engine.DisaggDecode, cartv1.Disaggregation_DISAGGREGATION_DECODE},
}

// DisaggToWire is how RouteRequest.disaggregation says an engine.Disagg.
func DisaggToWire(d engine.Disagg) cartv1.Disaggregation {
	for _, p := range disaggs {
		if p.e == d {
			return p.w
		}
	}
	return cartv1.Disaggregation_DISAGGREGATION_UNSPECIFIED
}

// DisaggFromWire reads RouteRequest.disaggregation; a value this build
// does not know routes whole.
func DisaggFromWire(d cartv1.Disaggregation) engine.Disagg {
	for _, p := range disaggs {
		if p.w == d {
			return p.e
		}
	}
	return engine.DisaggNone
}
