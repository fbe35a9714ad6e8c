package router

import (
	"context"

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
// (every event-fed one at start) has its model filled from the index
// here, in short lock holds.
func (l *Local) ApplyKVReport(worker string, r engine.KVReport) {
	var seed bool
	l.dec.Do(decider.OpKV, func(eng *engine.Engine) {
		eng.RemoveHoldings(worker, eng.ApplyKVReport(worker, r, nil))
		seed = eng.Seeding()
	})
	if seed {
		// At start the index is empty and this is quick (the router keeps
		// no index across restarts). After a feed went unsynced and came
		// back, it seeds over the index as it is, in short lock holds
		// (routing goes on between them); every worker's stream that
		// reports meanwhile joins in and reads no event until the seed
		// is done, its events waiting in the socket.
		l.dec.SeedModels(context.Background(), l.removeHoldings)
	}
}

func (l *Local) removeHoldings(worker string, hashes []uint64) {
	l.dec.Do(decider.OpKV, func(eng *engine.Engine) { eng.RemoveHoldings(worker, hashes) })
}
