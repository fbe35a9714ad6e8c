package cpclient

import (
	"testing"

	"github.com/cartrouter/cart/controlplane/engine"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

func TestDisaggWire(t *testing.T) {
	for _, d := range []engine.Disagg{engine.DisaggNone, engine.DisaggPair, engine.DisaggDecode} {
		if got := DisaggFromWire(DisaggToWire(d)); got != d {
			t.Errorf("%v round trip: %v", d, got)
		}
	}
	if DisaggToWire(engine.DisaggPair) != cartv1.Disaggregation_DISAGGREGATION_PAIR {
		t.Error("pair is not DISAGGREGATION_PAIR")
	}
	if DisaggFromWire(cartv1.Disaggregation(99)) != engine.DisaggNone {
		t.Error("an unknown value from a newer data plane does not route whole")
	}
}
