package health

import (
	"testing"
	"time"

	"github.com/cartrouter/cart/config"
)

func TestConfigFrom(t *testing.T) {
	h := config.Health{Endpoint: "/healthz", IntervalSecs: 0.5, TimeoutSecs: 2, FailureThreshold: 3, SuccessThreshold: 2}
	c := ConfigFrom(h)
	if c.Endpoint != "/healthz" || c.Interval != 500*time.Millisecond || c.Timeout != 2*time.Second ||
		c.FailureThreshold != 3 || c.SuccessThreshold != 2 {
		t.Errorf("ConfigFrom(%+v) = %+v", h, c)
	}
	if c.WorkerKey != nil || c.Models != nil {
		t.Error("ConfigFrom set hooks the config file does not describe")
	}
}
