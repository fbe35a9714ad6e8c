package decider

import (
	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
)

// PolicyFrom translates cache.* and session.* into the engine's policy, the
// same for both hosts (the all-in-one router and control-plane nodes).
func PolicyFrom(cfg *config.Config) engine.Policy {
	c := cfg.Cache
	p := engine.Policy{
		Threshold:           c.Threshold,
		MatchAbsThreshold:   c.MatchAbsThreshold,
		BalanceAbsThreshold: c.BalanceAbsThreshold,
		BalanceRelThreshold: c.BalanceRelThreshold,
		BlockChars:          c.BlockChars,
		CapacityBlocks:      index.CapacityBlocks(c.CapacityTokens, c.BlockChars),
		TTL:                 int64(config.Seconds(c.TTLSecs)),
		ClosedLoop:          c.ClosedLoop,
		HotFraction:         c.HotPrefixFraction,
	}
	if cfg.Session.Enabled {
		p.SessionTTL = int64(config.Seconds(cfg.Session.TTLSecs))
		p.MaxSessions = cfg.Session.MaxSessions
	}
	return p
}
