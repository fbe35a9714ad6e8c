package daemon

import (
	"testing"
	"time"

	"github.com/cartrouter/cart/config"
)

// A control-plane node honours cache.daily_cleanup_hour_utc like the
// all-in-one mode (it used to run the reset in all-in-one only), and hands
// the leader's lease and ticket cap to its decider, whose index map is
// presized (a node fills it).
func TestDeciderOptionsFromConfig(t *testing.T) {
	cfg := config.Default()
	if o := deciderOptions(cfg); o.DailyReset {
		t.Fatalf("default config (-1) enables the daily reset: %+v", o)
	}
	cfg.Cache.DailyCleanupHourUTC = 4
	cfg.ControlPlane.LoadLeaseSecs = 2.5
	cfg.ControlPlane.MaxUnsettledTickets = 77
	o := deciderOptions(cfg)
	if !o.DailyReset || o.ResetHourUTC != 4 || o.LoadLease != 2500*time.Millisecond || o.MaxTickets != 77 || o.MaxEntries != cfg.Cache.MaxTreeSize || !o.PresizeIndex {
		t.Fatalf("options = %+v", o)
	}
}
