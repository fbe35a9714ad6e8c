package decider

import (
	"github.com/cartrouter/cart/controlplane/index"
	"testing"
	"time"

	"github.com/cartrouter/cart/config"
)

// session.max_sessions reaches the engine.
func TestMaxSessionsFromConfig(t *testing.T) {
	cfg := config.Default()
	cfg.Session.Enabled, cfg.Session.MaxSessions = true, 7
	if got := PolicyFrom(cfg).MaxSessions; got != 7 {
		t.Fatalf("engine MaxSessions = %d, want 7", got)
	}
}

// The config's seconds and token capacities arrive in the engine's units.
func TestPolicyFromUnits(t *testing.T) {
	cfg := config.Default()
	cfg.Cache.TTLSecs, cfg.Cache.BlockChars, cfg.Cache.CapacityTokens = 1.5, 64, 1000
	cfg.Session.Enabled, cfg.Session.TTLSecs = false, 30
	p := PolicyFrom(cfg)
	if p.TTL != int64(1500*time.Millisecond) {
		t.Errorf("TTL = %d, want 1.5 s in ns", p.TTL)
	}
	if p.CapacityBlocks != 1000*index.CharsPerToken/64 {
		t.Errorf("CapacityBlocks = %d, want %d", p.CapacityBlocks, 1000*index.CharsPerToken/64)
	}
	if p.SessionTTL != 0 || p.MaxSessions != 0 {
		t.Errorf("sessions disabled but SessionTTL %d, MaxSessions %d", p.SessionTTL, p.MaxSessions)
	}
}
