package decider

import (
	"time"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/flow"
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
		ReservePriority:     cfg.Flow.ReservePriority,
		ReserveSlots:        cfg.Flow.ReserveSlots,
		PDThresholdTokens:   cfg.Disaggregation.ThresholdTokens,
	}
	if cfg.Session.Enabled {
		p.SessionTTL = int64(config.Seconds(cfg.Session.TTLSecs))
		p.MaxSessions = cfg.Session.MaxSessions
	}
	return p
}

// FlowFrom translates flow.* into the queue's options, the same for both
// hosts.
func FlowFrom(cfg *config.Config) FlowOptions {
	f := cfg.Flow
	return FlowOptions{
		Off: !f.Enabled,
		Limits: flow.Limits{
			MaxItems: f.MaxQueued, MaxBytes: f.MaxQueuedBytes,
			MaxItemsPerTenant: f.MaxQueuedPerTenant, MaxBytesPerTenant: f.MaxQueuedBytesPerTenant,
			ReturnCredit: f.ReturnCredit,
		},
		QueueTimeout:  f.QueueTimeout(),
		ReserveWindow: config.Seconds(f.ReserveWindowSecs),
		RetryAfter:    time.Duration(f.RetryAfterSecs) * time.Second,
	}
}
