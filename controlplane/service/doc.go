// Package service is the control plane's serving side: the Connect
// handlers for RouterService and AdminService, and the leader's loops (the
// placement batcher, the lease sweep, the health prober). Decisions, load
// and tickets belong to the node's decider (controlplane/decider), which
// answers at once; only the placements they produce go through Raft, in
// batches, so a Route never waits for a disk sync.
//
// # No Raft round trip per Route
//
// The leader decides from its in-memory engine and answers at once; placements
// (and withdrawals, applied first) are batched into one PlaceBatch entry every
// placement_batch_ms (50) or placement_batch_max (512). The interval was 10
// ms; at 5,000 routes/s followers spent 71-80 CPU µs per route at 10 ms, 53-55
// at 25 and 38-40 at 50 (bolt's fixed cost per transaction, paid per batch;
// bench/results/2026-12-01-batch), and routing never waits for a batch.
// (Followers apply it in steps so that routing interleaves; see package
// state.) Only the blocks a decision newly placed are replicated as
// placements, which keeps log growth proportional to new prefixes, not to
// traffic. A cache hit refreshes the LRU recency of blocks the worker already
// held; those refreshes ride in the batch as touches (applied first, refresh
// only: the recency and holding time of the leading blocks the follower still
// holds for that worker; never a new holding, since the leader may have
// withdrawn a placement within the window the touch refreshed it in),
// compactly: one per (worker, deepest matched block) per window at its newest
// time, none for a pair touched less than a second ago (the leader's table of
// recent touches is two generations of at most 65,536 keys), and at most 4,096
// blocks per window (a chat turn's touch carries its whole history). So
// followers, and a new leader, age hot prefixes as the old leader did, to a
// second. Touches are hints, not ledger ops: a failed batch drops the touches
// queued behind it and undoes none (the leader's refresh stays). A window also
// drops the ops of a worker whose index id changed since they were queued (its
// cache cleared, committed at once by the KV applier), which replicated would
// give followers the holdings the clear took. A new leader's index lacks at
// most the last batch window.
//
// Follower index ageing (a known limitation): LRU refreshes replicate as
// touches at one-second resolution per (worker, prefix), so a follower's
// recency order can differ from the leader's within a second, and a touch lost
// with a failed batch window is not sent again. The closed loop's learned
// capacities are leader-local and start over after a failover (declared
// capacities' models are kept on every node from the log; event-fed ones are
// seeded from the index on the new leader).
//
// # The placement ledger
//
// The leader's index runs ahead of the log (placements at decision time), so
// the batcher keeps a ledger of those changes until their batch commits (the
// state machine reports own batches and every other committed placement to it,
// under the engine lock). A batch that fails to commit is undone together with
// the window queued behind it, newest first, skipping blocks a committed entry
// of another proposer (or a decision made while the undo runs, in steps) set
// since, and then forgotten: if a majority had it after all, it is applied
// from the log like on any follower. So a deposed leader ends with the same
// entries as the others (partition test). A snapshot taken on the leader
// applies the same undo to its copy, so it stands for the log at its index and
// never persists a placement that may not commit.
//
// # Followers forward
//
// Followers forward Route/Complete/Sync and admin calls to the leader (marked
// Cart-Forwarded, so a stale view can never loop). One helper does it, as the
// first line of each handler (forward/forwardWrite in forward.go, Consul's
// ForwardRPC shape); cart_cp_forwarded_total{procedure} counts what a follower
// passed on. Data planes learn the leader's URL from Sync and from every Route
// answer (RouteResponse.leader_url), so after a failover only the first call
// pays the forwarding hop. A node with no leader refuses with Unavailable
// ("minority partition"); admin writes are acknowledged only after commit.
// "Not the leader" is a structured error detail, cart.v1.NotLeader{leader_id,
// leader_url} (on Unavailable, FailedPrecondition and the Aborted "unknown"
// answer), which cartctl and data planes read instead of the message. A write
// appended but not known committed (leadership lost, gave up waiting, a
// forwarded call that lost its answer) is answered Aborted +
// Cart-Write-Outcome: unknown, never "no leader": it may still commit. Choice:
// Aborted rather than Unavailable-with-a-detail because clients branch on the
// code, and Unavailable already means "not done, try another member";
// DeadlineExceeded is what a client's own timeout looks like. Clients repeat
// the (idempotent) command.
//
// Health checks run on the leader only (one prober per pool); data planes
// learn verdicts through Sync.
//
// # Streams and answers
//
// The Route stream's server side is stream.go and the placement feed's ring is
// placementfeed.go; both are described with their data-plane side in package
// remote (dataplane/remote). Response origins are replicated through the
// batcher too (controlplane/affinity).
//
// Messages are not compressed below 4 KiB: gzip of ~100-byte Route answers
// cost 18-29% of the leader's CPU per route. RouterService answers are never
// compressed: the large ones are placement-feed frames of random block hashes,
// which gzip cannot shrink, and compressing them took ~7% of the leader's CPU
// at 5,000 routes/s (bench/results/2026-12-01-nogzip).
//
// # Bodies
//
// The API reads a body under controlplane.api_body_read_timeout_secs (10 s;
// the proxy's body budgets are in package proxy). Measured with
// e2e/attacks/cp_stalled_route.sh: forty Route calls sending 3.8 of 3.9 MB and
// stalling were held open indefinitely before; now all forty are answered
// (504) and closed 10 s after they started. Their peak (about 240 MB) is
// unchanged, since the bytes arrive before the stall: bounding it takes
// authentication before the body is read, or a byte budget on the API.
//
// # Slow-leader handover (controlplane.slow_leader_handover, off by default)
//
// Raft cannot see a leader that is slow for its data planes: its heartbeats
// may still arrive in time. Data planes report, in each Sync, the p90 of their
// Route calls since the last sync (a call that timed out counts as the time it
// waited), the node those calls went to, and whether their control-plane
// breaker is open (dataplane/remote/latency.go). The leader (handover.go)
// counts only reports about itself (a data plane calling a follower measures
// the forwarding hop too) and hands leadership over (raft.LeadershipTransfer,
// which picks the most up-to-date follower and brings its log level first, or
// fails) when more than half of the data planes reporting in the last
// window_secs see it slow (p90 ≥ threshold_ms or breaker open) for a whole
// window, at least one follower answers its heartbeats
// (raftnode.HealthyFollowers, from raft's heartbeat observations), and damping
// allows: at most once per min_interval_secs per node, never in a node's first
// min_interval_secs as leader. Logged ("leadership handed over (slow leader)",
// an audit line) and counted in cart_cp_slow_leader_handovers_total{result}.
// Choice: off by default, from bench/results/2026-12-01-slowleader (three-node
// control plane, leader's Route delayed 200 ms for 10 s): with it on, data
// planes get answers from a new leader ~4.1-4.5 s into the fault and the
// fallback share falls from 100% to the no-fault level; but the modelled hit
// ratio does not rise (the shadow fallback already holds 74-83%, the control
// plane's own routing scores 59-67% in that model, which charges nothing for
// load), and the signal cannot tell a slow leader from slow data-plane hosts:
// on the loaded bench machine a healthy leader already missed the 20 ms route
// timeout on 1-35% of calls, so starved data planes would move leadership once
// per interval for nothing. Turn it on where losing the pool-wide view matters
// (max_load is then a per-data-plane cap, responses and sessions are pinned by
// the leader) and the data planes' hosts are not the likely bottleneck; keep
// threshold_ms below dataplane.route_timeout_ms.
package service
