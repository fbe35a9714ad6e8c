// Package flow is the scheduler of requests waiting for a saturated pool:
// which one goes next when a worker has room. It is pure (no I/O, no
// goroutines, no clock: times are arguments) and not safe for concurrent
// use; its host (controlplane/decider) calls it under the routing lock, so
// that "a worker has room" and "this request takes it" are one step.
//
// The policy, in order:
//  1. Priority: a higher band is always offered first (strict priority).
//  2. Fairness between the tenants of a band: the backlogged tenant with the
//     least weighted tokens served goes first — the virtual token counter of
//     "Fairness in Serving Large Language Models" (Sheng et al., OSDI 2024).
//     Counting tokens rather than requests keeps long prompts from crowding
//     others out. A tenant that becomes backlogged starts where the last
//     request started (start-time fair queuing's virtual time, Goyal, Vin and
//     Cheng, SIGCOMM 1996), or at the least counter among the band's
//     backlogged tenants if that is lower, less Limits.ReturnCredit requests
//     the size of the one it brings (flow.return_credit, 2 by default). Idle
//     time is not saved up as credit beyond that bound: a returning burst of
//     up to ReturnCredit+2 equal requests goes before the backlogged
//     tenants' next one, and no more, however long the tenant was idle.
//  3. Order within a tenant: earliest deadline first, where a request
//     without a deadline of its own has its queue timeout as its deadline;
//     for requests that all carry the same timeout that is first come,
//     first served.
//
// Late binding: the queue never names a worker. Dispatch offers items in
// policy order to a callback that tries to route each one (the cache-aware
// choice among the workers with room) and says what became of it; an item
// no worker with room can take is skipped, not blocking the ones behind it,
// so no worker idles while a request it could serve waits (work-conserving).
//
// Its host is the decider (controlplane/decider, flow.go); saturation is the
// engine's (controlplane/engine, saturation.go). What users see and configure:
// docs/flow-control.md.
//
// # Where the queue lives
//
// The decider already owns every worker's in-flight count (in process for the
// all-in-one router, on the leader for the fleet), so the queue sits beside
// it, under the same lock: "a worker has room" and "this request takes it" are
// one step. The scheduler (this package) is pure (no clock, no I/O, fuzzed for
// its invariants: nothing lost or dispatched twice, bounds never exceeded,
// strict priority within the window it looks at, the least-served tenant
// first); the decider hosts it. Choice: one fleet-wide queue on the leader
// rather than llm-d's per-replica queues: it is what makes priority and
// fairness hold whichever data plane a tenant reaches, and it costs nothing
// extra (a queued Route call is one stream call that answers later).
//
// # Saturation is a count against a limit
//
// The engine's metrics only set the limit (learned concurrency); deciding on a
// scrape that is up to a second old would either send a burst into a full
// engine or hold requests back from one that just freed a sequence. The
// learned limit drops at once when the engine queues and grows by one only
// after GrowAfter (30) reads in a row at the limit with nothing waiting:
// probing on every read kept one request in the engine's own queue half the
// time, where priority and fairness no longer apply. Probes that find no
// room back off (twice the wait each, up to MaxGrowAfter = 960 reads), and
// the scraper reads a probed engine again a tenth of an interval later: at
// one probe in 31 reads, the flood benchmark's engines, whose batch limit
// is fixed, held a probed request in their queue one second in 31.
//
// # Late binding in the decider
//
// The engine's Freed count moves on every event that may give a saturated
// worker room (a release, a worker back in service or out of draining, a
// raised limit, the headroom lapsing, loads replaced by a Sync); unlock offers
// the queue to the engine whenever it moved since the last pass (pump), so a
// completion's own lock hold binds the next request. Each offer is an ordinary
// decision among the workers with room, so a waiting request still goes to its
// prefix when its prefix holder has room; one that no worker with room can
// take (another model, a pinned response) is skipped, not blocking those
// behind it. A pass offers at most 64 requests (each a decision of 10-50 µs),
// so its lock hold stays bounded.
//
// # The leader's side of a queued call
//
// A stream call that waits gives its slot of the stream's 256 back (a queue
// deeper than that must not stop the stream from carrying the completions that
// free room), is answered at once with an interim queued answer, and its
// expiry (the data plane's 20 ms route timeout) no longer applies; its own
// queue deadline does. An abandon report of a queued call (its client left)
// cancels its wait. Losing leadership answers every queued call "not leading".
//
// # The data plane's side
//
// After the interim answer it waits for the final one until the queue deadline
// (plus a second, so the leader's 429 comes first). A queued call whose stream
// breaks is asked again of whoever leads next with its first arrival (FCFS/EDF
// order is by arrival plus timeout, so it keeps its place) and the old one
// reported abandoned: the old leader removed it from its queue when its stream
// ended, or releases what it dispatched into the void. While no leader
// answers, requests that find every worker at its limit by this data plane's
// own counts wait in a local flow.Queue with the same policy (per data plane),
// and go to the leader when one answers again (a Sync or a Route answer). A
// unary Route call carries no admission (it cannot read an interim answer): a
// saturated pool is a 503 there, as before, except while the stream is
// reconnecting, when the call waits for it and asks again.
//
// # Fairness counts tokens, charged twice
//
// At dispatch a request is charged its estimated prompt tokens (key length /
// 4); its usage report corrects that to prompt + completion tokens
// (Outcome.CompletionTokens, Completion.completion_tokens). A tenant that
// becomes backlogged is lifted to the virtual time (the largest counter a
// request started at, whether it waited or found room: Queue.Started), or
// to the least backlogged counter of its band if lower, so idle time is not
// saved up, nor usage that others had while the pool had room (a tenant
// returning when nothing waits is lifted too). Counters of idle tenants are
// forgotten beyond 4,096, least recently active first.
//
// Why the virtual time and not the least counter, which is the paper's rule:
// the backlogged tenants' counters already include the cost of the requests
// they have running, so lifting a returning tenant to equal them puts the
// second request of a burst behind one request of each of them. Starting it
// where the last request started, as start-time fair queuing does, lets a
// burst of two go first; the credit is one request, however long the tenant
// was idle, and a tenant that stays backlogged gains nothing from it.
//
// Why more credit than that (ReturnCredit): an interactive tenant's
// requests come in bursts (Poisson arrivals bunch), and with one request of
// credit the third of a burst took turns with the flood, a sequence's length
// later. Starting up to ReturnCredit requests further back is the sleeper
// credit Linux's CFS gives a waking task (placed a bounded way behind the
// least virtual runtime): the lift is a bound on where a returning tenant
// starts, not a gift on each return, so a tenant whose counter is already
// above it (served past its share lately) gains nothing, and one that sends
// a burst each time its last one leaves the queue is served its share over
// time, no more (TestReturnCreditKeepsTheShare). Two tenants that both stay
// backlogged never use it.
//
// Charging at the end rather than token by token (the paper's counter grows
// with every token decoded) needs two corrections, or an interactive tenant
// loses the first free slot after it returns to a flooded pool. The report of
// its previous request, finishing while it waits, was service before the
// lift, which already counted it as served up to the flood's counter: it
// fills the lift before it adds (ChargeSince, by the lift number the request
// was dispatched under). And on equal counters the tenant lifted last goes
// first: the other's running requests have served tokens not charged yet. In
// the flood benchmark, before these, 44 of 226 calm requests saw one or two
// flood requests dispatched while they waited (from the decision log's
// queued_ms): 21 behind a request of their own tenant (a burst, ordered as
// designed), 23 with nothing of their tenant queued, the case these fix.
//
// # Defaults
//
// On, because a pool with room is unaffected: nothing waits while an eligible
// worker is below its limit, and a worker has no limit until one is declared
// or its engine queued. Headroom off (reserve_slots: 0): it costs throughput
// whenever high-priority traffic is active.
//
// # The dispatch window
//
// A dispatch pass looks at the first 8 requests of each (priority, tenant) and
// offers at most 64: a request that no worker with room can take (another
// model, a pinned response) behind 8 such requests of its tenant waits for the
// next pass, and strict priority holds within that window. Fairness counts
// tokens from usage reports: an engine that reports no usage is charged its
// requests' estimated prompts only.
package flow
