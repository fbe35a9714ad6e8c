package router

import (
	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
)

// ClearHoldings drops every holding of worker (its engine reported its KV
// cache cleared); the all-in-one router's side of controlplane/kvtruth.
func (l *Local) ClearHoldings(worker string) {
	l.dec.Do(decider.OpKV, func(eng *engine.Engine) { eng.ClearHoldings(worker) })
	l.dec.Purge() // the old holdings, in short lock holds
}

// ApplyKVReport makes worker's model follow its engine's reported cache and
// drops the holdings the engine has evicted. A worker nobody modelled
// (every event-fed one at start) has its model filled from the index on
// Run's seeding loop, in short lock holds, as on a control-plane leader:
// this report's stream goes on reading meanwhile. (Its eviction trims,
// and those of the reports until the seed is done, come at the seed's
// end.)
func (l *Local) ApplyKVReport(worker string, r engine.KVReport) {
	var seed bool
	l.dec.Do(decider.OpKV, func(eng *engine.Engine) {
		eng.RemoveHoldings(worker, eng.ApplyKVReport(worker, r, nil))
		seed = eng.Seeding()
	})
	if seed {
		l.seeder.Wake()
	}
}

// seedTrim drops the holdings a seed's deferred trims name.
func (l *Local) seedTrim(worker string, hashes []uint64) {
	if l.seedTrimHook != nil {
		l.seedTrimHook()
	}
	l.dec.Do(decider.OpKV, func(eng *engine.Engine) { eng.RemoveHoldings(worker, hashes) })
}
