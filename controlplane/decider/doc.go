// Package decider is the routing core, hosted two ways: in process by the
// all-in-one data plane (dataplane/router.Local) and by every control-plane
// node (controlplane/service on the leader, controlplane/state applying the
// log on every node).
//
// A Decider owns, behind one lock that never leaves this package:
//   - the engine (controlplane/engine) and its prefix index;
//   - the clock decisions are stamped with (injectable for tests);
//   - maintenance: eviction to the size bound in short steps, TTL and
//     session expiry, the daily reset — the same loop in both hosts;
//   - tickets: a decision's claim to settle (the load it took, the blocks it
//     newly placed), as a concrete type, and settling them: releasing the
//     load, withdrawing an undelivered placement, feeding usage back;
//   - the load view: in-flight counts per worker, and on a control-plane
//     leader the per-data-plane counts behind them (Route, Complete, Sync,
//     the lease sweep and worker-set changes all change it here, nowhere
//     else).
//
// The pure packages below it (engine, index) read no clock and take no lock;
// everything above it (the proxy, the Connect handlers, the Raft state
// machine) calls methods. The state machine and the placement ledger keep
// state of their own that must change together with the index (the worker
// specs, the ledger of placements ahead of the log): they run that code
// through Do, inside the decider's critical section, never by holding the
// lock themselves.
//
// Every critical section is timed and exported as the histogram
// cart_decider_lock_hold_seconds{op}: a decision waits for whatever holds
// the lock, so the slowest operation bounds routing latency.
//
// Tickets are one concrete type: a ticket the decider did not issue is refused
// and counted in cart_decider_rejected_tickets_total, never ignored. Capacity
// errors map to one value (ErrNoCapacity), which the data plane turns into a
// 503. Maintenance runs on control-plane nodes too (see Bounded lock holds).
// The lock-hold histogram has 10 µs-100 ms buckets and is exported by
// control-plane nodes and by the all-in-one data plane.
//
// # The leader's load view
//
// Load is leader soft state. Route increments the chosen worker's load and
// records a ticket (data plane, worker, newly placed blocks); its completion
// releases it and, for undelivered requests, withdraws the placement
// (replicated in the next PlaceBatch entry's withdrawals; the UnplaceBatch
// entries older versions wrote are still applied, only so that their logs
// replay). Sync (every 500 ms per data plane) carries the data plane's
// absolute in-flight counts per worker, which replace what the leader had for
// that data plane — this reconciles drift both ways and folds in requests the
// data plane routed by local fallback. A data plane whose syncs stop is
// dropped after load_lease_secs, taking its load with it. A new leader starts
// from zero load and rebuilds it from syncs within one interval.
//
// # A Sync's fence
//
// The counts are taken at one instant on the data plane, while messages that
// change them are on their way: a Route answer the leader counted and the data
// plane has not received, and the report of a request the data plane finished
// and the leader has not settled. Replacing the leader's count by the bare
// counts would lose those until the next Sync, and the late report would then
// release a request the Sync had already taken off (another of the data
// plane's, floored at zero); a report that finished after the counts but
// overtook the Sync would be counted again. So the same lock hold that takes
// the counts also takes a fence (SyncRequest fields 8-13): the newest route
// id, the calls without an answer and the abandon reports not yet
// acknowledged, the tickets of finished requests whose reports are not
// acknowledged (queued, riding, in a flush, or queued again after a failed
// one), how many ticketed requests have finished (each report carries its
// number, Completion.done_seq), the process's first route id (each process
// starts at a random point) and the Sync's number. The leader applies a Sync
// only if it is newer than the last it applied for that process (a late copy,
// or one sent again unary after the stream broke, is not). It adds back the
// tickets it still holds for open calls, for calls made after the counts
// (newer route ids among the tickets no applied Sync accounted for yet) and
// for unsettled reports, and takes off the reports it settled that finished
// after the counts were taken, for calls answered before them. Each later
// report then releases exactly one: TestSyncFenceCountsWhatReportsWillRelease
// walks every case, and TestSyncFenceUnderRandomInterleavings checks, after
// every step of 300 random runs in which every message between a data plane
// and the leader arrives in any order, report batches and Syncs fail on the
// data plane's side and arrive late, twice or never, that the leader's load is
// exactly its tickets still to be released. A Sync without a fence (an older
// data plane, or more than 32,768 ids to list) is taken as it is. A failed
// Complete call's reports are queued again (they may have arrived; settling
// twice is a no-op), up to 32,768 per queue, and while flushes fail no full
// queue forces one.
//
// What the fence does not cover. Reports past the 32,768 a queue keeps while
// the control plane cannot take them are dropped, and a dropped one that did
// reach the leader late releases a request the next Sync had already taken
// off. A data plane restarted under the same id is a new process to the
// leader, whose last Syncs of the old one, if they arrive after the new one's
// first, are applied once. An abandon report that overtakes the call it names
// (the data plane ages them so that they do not) leaves a ticket no report
// releases, counted until a Sync whose fence no longer lists the call, then
// settled by the stale-ticket rule. A Sync from a data plane that predates the
// fence is taken as it is. Each costs at most one Sync interval.
//
// # No ticket outlives its purpose
//
// A data plane that gives up waiting for Route (route_timeout_ms) reports the
// call as abandoned in Complete, by the route_id it sent (it has no ticket),
// and the leader releases the load and withdraws the placement; a Route whose
// caller's deadline passed while the leader decided is undone on the spot.
// Past load_lease_secs, a ticket is kept only while its data plane's Sync
// still counts that many requests in flight on the worker (long streams keep
// theirs); the excess, oldest first, is settled as undelivered. At most
// controlplane.max_unsettled_tickets are kept; beyond, the oldest is settled
// as undelivered. Both are counted in cart_cp_tickets_dropped_total{cause}.
// Neither rule walks the live tickets: they sit on issue-order lists, one for
// all and one per (data plane, worker), so the sweep looks only at pairs with
// more tickets than their count and the cap drops a list head (a full walk
// held the lock 36 ms with 100k live tickets, which long generations on a
// large fleet reach; now ~1 µs, go test -run '^$' -bench 'Sweep$'
// ./controlplane/decider). A Complete batch settles in lock holds of 64
// completions.
//
// # Two tickets for a prefill/decode pair
//
// Each leg of a prefill/decode pair (engine, roles.go) holds its own ticket
// and load, released when its leg ends: a prefill worker's load is back as
// soon as its answer is read, not when the stream ends. On the leader the two
// tracked tickets share the call's route id: the decode ticket is the one
// byRoute finds and names the prefill ticket (pair), so an abandoned call
// settles both and a Sync's fence adds both of an open call; issued and
// settled refs are per ticket, so the fence's arithmetic is unchanged. Data
// planes count both legs in flight from the answer on (closeCall). Flow
// control charges the tenant through the decode ticket only.
//
// # Bounded lock holds
//
// Every node bounds its own index: the maintenance loop (eviction to
// max_tree_size in 128-entry steps, TTL and session expiry, the daily reset)
// runs on followers too, since they apply placements. What each node evicts is
// a cache decision, not replicated state.
//
// Lock holds over 1 ms of wall clock remain, from scheduling rather than work
// (a known limitation). No operation holds the routing lock for a pass over
// the index or over an unbounded list any more, but on a box where four busy
// processes share two cores a hold of 0.1-0.3 ms of CPU is sometimes stretched
// to several ms of wall clock by the OS (decide p99: docs/benchmarks.md).
// Bounded steps, each measured in CPU time: removed and cleared workers'
// entries are purged 2,048 slots per hold (90-200 µs, where one pass took 46
// ms at 1M entries); the daily reset drops the index's hash table and pages
// without visiting entries; the first KV report of an unmodelled worker seeds
// its model in steps (controlplane/kvtruth); a snapshot's restore puts its
// entries back 512 per hold (controlplane/state); and a batch that fails to
// commit is undone at least 512 blocks per hold, 0.12-0.15 ms of CPU at the
// median and at most 0.4-1.7 ms (BenchmarkFailedBatchUndoStall: a
// 10,000-decision, 400,000-block window, one 136 ms hold before). Decisions
// made between two undo steps fence the (worker, block) pairs they set, so the
// rest of the undo leaves them.
package decider
