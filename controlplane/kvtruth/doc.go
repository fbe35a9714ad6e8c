// Package kvtruth feeds the engines' own KV-cache events (vLLM, SGLang; see
// package kvevents) into the routing engine: a cleared cache drops the
// worker's holdings at once, and the stored and removed blocks give the
// engine's real occupancy, which the worker's modelled capacity follows
// instead of a declared or learned guess. A stream that loses batches beyond
// replay puts its worker back on the approximate index until the engine's
// state is known again (its next cache clear or restart).
//
// It runs once per engine in the process that owns the index: the
// all-in-one router, or the control-plane leader (never the data planes),
// and stops with its context.
//
// Once per engine, where the index lives. The all-in-one router and the
// control-plane leader (a leader loop, stopped on step-down) subscribe; data
// planes never do, so an engine has one subscriber however many data planes
// run (llm-d and Dynamo subscribe from every router replica).
// kvevents.Subscriber is one ZMQ SUB socket (pure Go: go-zeromq/zmq4,
// vmihailenco/msgpack): dialled to an engine's PUB, one socket per
// data-parallel rank at the rank-0 ports + rank (SGLang's batches do not name
// their rank, so the socket does), or bound once for engines that dial it,
// topic → worker, the batch's data_parallel_rank telling ranks apart.
//
// # What the events set, and what they do not
//
// Engine block hashes are over the engine's tokens; CART's index is over
// characters of the key text, so the two never match block for block. The
// events are used for what does not need matching: clears (drop every holding
// of the worker), and occupancy. Each rank keeps the set of GPU block hashes
// it holds (stored minus removed; offloaded tiers ignored) and its peak; once
// the engine has evicted, its peak occupancy is its cache size, which becomes
// the worker's modelled capacity (replacing the declared one and switching the
// closed loop off for that worker), and after an eviction the worker's oldest
// modelled holdings beyond the reported occupancy are dropped. Stores tell
// more than occupancy: an engine that stored blocks CART did not place
// (requests that reached it another way, recomputation, blocks CART took for
// held) has less room for CART's holdings. A per-worker ledger of the engine's
// latest stores, a cache's worth in 64 buckets, matches them against CART's
// new placements (a placement is owed until the engine reports a store for it,
// at most a cache's worth); the model is trimmed to the capacity less the
// foreign ones, oldest holdings first. Choice: counts, not hashes (the two
// hash spaces never match); the approximation errs toward forgetting (a hit
// CART did not predict counts as foreign). With traffic flushing two of four
// replicas behind CART's back: 67.5% hit ratio without events, 85.2% with
// (bench/results/2026-12-07-kvevents). Among equally loaded workers a new
// prefix goes to the event-fed engine with the most room (capacity less
// occupancy): an LRU engine is full once warm, so this picks one that
// restarted or was cleared, where random placement pushed others' prefixes out
// (restarts: 76.4% with events before this rule, 81.7% after, 81.2% without
// events). Each rank's block set is capped at kv_events.max_hashes_per_rank
// (oldest out, cart_kv_event_hashes_dropped_total), and a listen-mode topic
// takes at most data_parallel_size (else 64) ranks. Choice: no capacity before
// the first eviction rather than the declared guess: an engine that never
// evicted has nothing to forget, and a declared size that is too small would
// forget what it still holds.
//
// # Seeding a new model
//
// A model created when the first event arrives (every event-fed worker on a
// new leader, at the all-in-one router's start) starts empty and live, and is
// seeded from the index in steps (engine.SeedStep, driven by
// decider.SeedModels on a decider.Seeder loop that a report wakes: on the
// leader beside the KV flush loop, ending with leadership; in the all-in-one
// router beside index maintenance, ending with the router; so neither the
// event streams nor a step-down wait for it): one oldest-first walk of the
// index, 1,024 entries per lock hold and shared by every worker waiting,
// collects each one's (hash, time); the list is ordered outside the lock (most
// recently sent first, the index's LRU order breaking ties, as the one-shot
// walk did); then 256 holdings per hold go to the model's old end, skipping
// those placed again or dropped since, forgetting those beyond the capacity.
// On a 1M-entry index with 8 workers seeding at once: 133-195 µs at p99 and
// 725-834 µs at most per hold (one worker: 114-172 µs, 206-356 µs), against
// 59-93 ms for the one-shot walk (CPU time, go test -run '^$' -bench SeedStep
// -benchtime 3x ./controlplane/engine). Choice: an eviction reported while a
// worker is seeding trims nothing until the seed ends (its model lacks the
// oldest holdings, so its tail is the wrong end), then trims to the occupancy
// reported last. A seed whose worker is removed, cleared, reset or drops its
// model (feed unsynced) is abandoned. A snapshot's install (and the daily
// reset) drops an event-fed worker's model and seed, and its next report seeds
// a new one from the restored index (an empty model over a refilled index
// would trim its newest blocks first).
//
// # Never a wrong index
//
// A loss (gap beyond replay, undecodable batch) marks the stream unknown: the
// worker's report becomes "not synced", its model goes back to the declared
// capacity or closed loop, and its set is no longer trusted. It is known again
// at the engine's next AllBlocksCleared or restart (both mean "empty now").
// Clears are applied in every state.
//
// # Distributed
//
// The leader's model follows the reports at once (leader soft state, like the
// closed loop; what the model itself then evicts stays leader-local: followers
// apply replicated placements through their own model, sized by the declared
// or learned capacity, not by the reports); every index change the events
// themselves ask for goes through the log: a clear as an ignorable
// ClearHoldingsCommand proposed at once, evictions as a PlaceBatch with only
// withdrawals of (worker, hashes), collected per 10 ms window. A failed
// proposal is not retried: the next report asks for the same trim, and a lost
// clear leaves only what the approximate index keeps anyway.
//
// # Cost
//
// A batch is decoded off the routing lock; applying it takes the engine lock
// once (O(1) without an eviction, O(trimmed blocks) with one); a clear is
// O(index entries) under the lock (RemoveWorker), like a removed worker.
// Memory: about 55 bytes per engine block held (a map entry and a list node,
// to know the oldest), at most max_hashes_per_rank per rank: a flood of 10M
// forged stores holds 53 MiB, against 289 MiB uncapped (BenchmarkStoredFlood).
//
// Why CART does not route by the engines' own block hashes: docs/kv-events.md.
package kvtruth
