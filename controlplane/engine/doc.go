// Package engine is CART's routing policy: given the usable workers, their
// load and the prefix index, it decides where a request goes and why.
//
// Like the index it is pure: no I/O, no goroutines, no clock (time comes in
// as an argument), no locks (callers serialise access), and its randomness
// comes from a source the caller provides, so every rule is table-testable.
// The in-process router of the all-in-one mode and the control plane's
// leader both drive the same Engine.
//
// Choose implements the routing rules of README.md ("How a request is
// routed"); a new rule adds its reason to reasons.go, whose test fails until
// the proto comment and cartctl's explain know it. Load is in-flight requests;
// load_penalty counts in every comparison. Release is guarded: load never goes
// below zero, and an extra release is counted
// (cart_load_release_underflows_total, expected to stay 0) instead of hidden.
// SetWorkers keeps load, health and index entries of workers that stay, which
// is what makes SIGHUP reloads warm.
//
// # Placements
//
// Placements are recorded at decision time, so a burst of requests sharing a
// prefix follows the first one immediately. A decision remembers which blocks
// it newly added for its worker (Decision.Placed); if the request never
// reaches the worker (connection error, retryable rejection) those blocks are
// withdrawn, so a retried request leaves no phantom holder. Blocks the worker
// already held are never withdrawn.
//
// # Routing quality (all switchable, off by default)
//
// Capacity-aware index (workers[].cache_capacity_tokens,
// cache.capacity_tokens): each worker gets an LRU model of its prefix cache in
// index blocks (a token = 4 characters); when the model evicts a block the
// worker stops being its holder, so a prefix the replica has most likely
// evicted no longer counts as a match. cache.ttl_secs ignores placements older
// than the TTL. Measured under cache pressure (llm-d workload): TTFT p99
// −26-31% at equal hit ratio.
//
// Closed loop (cache.closed_loop): usage reports (cached_tokens) are compared
// with the prediction; a worker that had less than half of a prediction older
// than 2 s (younger ones may still be in prefill) gets its modelled capacity
// cut to 90% of what the model holds, dropping its oldest entries; confirmed
// predictions grow it back by 1% up to the configured size (with none, up to
// the index's own bound, where the limit lapses). It learns a capacity nobody
// declared. Models never outgrow the index: every block the index drops for a
// worker (eviction, expiry, withdrawal, reset) leaves that worker's model
// through index.OnRelease, and a block the index skipped when full is never
// modelled. (Before this, a soak grew the models without bound while the index
// stayed at max_tree_size.) Predicted vs actual per worker is in /workers and
// the cart_cached_fraction metrics, and reaches the control plane in Complete.
//
// Session affinity (session.*): the first key present (X-Session-Id,
// prompt_cache_key, user, in configured order) sticks to its worker unless the
// balance rule says that worker is overloaded; idle sessions expire.
//
// Hot-prefix spreading (cache.hot_prefix_fraction): a decayed count of
// prefixes at depths 1, 2, 4, … blocks; a prefix in at least that fraction of
// recent requests is not counted as a match, so requests sharing only it go
// least-loaded and it spreads over the pool, while the deeper,
// conversation-specific match still decides.
//
// # Bounds
//
// MaxRouteBlocks (1024 blocks = 128k characters at the default 128 per block)
// bounds the routing lock's hold: a decision matches and records at most that
// many blocks; the proxy hashes only that prefix and the control plane
// truncates longer Route requests instead of refusing them. Measured (go test
// -bench RouteMaxBlocks ./controlplane/engine, CPU time on a 1M-entry index,
// busy 2-core VM): 1024 blocks 42 µs hit / 0.5 ms miss; 4096 blocks 0.5 ms /
// 2.2 ms, hence 1024. Cost: prompts that share their first 1024 blocks are not
// told apart by what follows. Splitting a decision's insertion into several
// lock holds would allow a deeper cap.
//
// Sessions (session.max_sessions, 100000) are a memory budget too: keys are
// client-chosen strings of any size; the proxy sends the router a 128-bit
// SHA-256 prefix (hex) and the engine keys its table by a 128-bit hash too (a
// cryptographic hash, so nobody can craft a collision to steer another
// client's session). The table is an LRU list: a full table forgets the least
// recently used session, and expiry walks from the old end, stopping at the
// first live session, in steps of the maintenance chunk, so it never scans the
// table under the routing lock.
//
// # Prefill/decode pairs
//
// Roles are part of the worker set (engine.WorkerSpec.Role, replicated in
// WorkerSpec.role; empty reads as both, so logs and snapshots from before
// roles replay unchanged). The decision is the engine's (roles.go), so
// all-in-one, the leader and nothing else decide it: a request that may be
// split (Request.Disagg) gets a prefill worker by the ordinary cache-aware
// rules over the prefill workers, and a decode worker by load alone over the
// decode workers (no prompt to match: the decode worker is sent the computed
// cache). Choice: the placement is the prefill worker's only. vLLM's decode
// engine does cache the blocks it pulls, but the next request of the
// conversation is prefilled on a prefill worker, which is where a hit saves
// compute; recording the decode worker too would make a decode worker a cache
// candidate for whole requests it should not get while both workers are in
// service. The engine chooses both legs before taking either (choose then
// commit), so a pair that cannot be completed takes nothing.
//
// Whole instead of split: below disaggregation.threshold_tokens uncached
// tokens on the worker that would take it whole (llm-d's pd-profile-handler
// threshold, measured on the whole candidate as llm-d measures on the decode
// pod); or when no prefill or no decode worker can take it (down, or excluded
// after failing this request), onto both workers, or onto decode workers in a
// pool with no both worker in service, since vLLM's and llm-d's decode
// instances compute a request that carries no transfer parameters. Choice: a
// prefill side that is only saturated in a pool without both workers makes the
// request wait (flow control) rather than spill prefill work onto the decode
// workers, which would slow every stream they carry; with a both worker that
// has room the request goes there, since flow control promises that nothing
// waits while an eligible worker has room.
package engine
