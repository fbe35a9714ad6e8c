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
package decider
