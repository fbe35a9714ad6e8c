// Package remote is the data plane's Router backed by the control plane:
// every decision is asked of the Raft leader (one shared index and load
// view for all data planes), and when the control plane is slow or
// unreachable the data plane routes locally to its least-loaded usable
// worker, so clients never see the control plane's trouble.
//
// # The Route stream
//
// The Route stream (dataplane.route_stream, on by default; stream.go here and
// in controlplane/service): a data plane carries Route, Complete and Sync on
// one long-lived RouterService.Stream (Connect bidi over HTTP/2, same bearer
// auth) to the leader, each call matched by id, instead of one HTTP/2 request
// each (measured in-process, BenchmarkRoute in this package, 1 and 32 callers
// on the shared 2-core box: 2-3x less time per route, 57 instead of 249
// allocations). Calls ready together (queued while a send is in progress)
// share one message (StreamRequest.more, at most 64 calls and 1 MiB), and so
// do answers and feed frames (StreamResponse.more, at most 64), through
// internal/coalesce: no linger, so a lone call goes out at once as before, and
// a caller sends at most twice before handing the queue to a goroutine. Each
// side batches only to a peer that declared in the hello that it reads them
// (batches), so mixed versions keep one call a message. At 32 callers this
// cuts messages to ~0.8 per call and ~0.35 per answer and lifts the in-process
// benchmark from 20.6-23.1k to 24.6-28.0k routes/s
// (bench/results/2026-12-02-bufconn-batch/micro.txt); the three-node
// cart-bench cp runs show no gain beyond their noise, since at 5,000 routes/s
// a data plane has about one call in flight.
//
// The stream goes live only after the leader answers a hello, so calls never
// wait for it to open; until then, and whenever it is down, the unary calls
// are used (cart_route_stream_fallbacks_total{call}; cart_route_stream_open).
// At most route_stream_max_in_flight calls are in flight on it; a call that
// cannot get a slot within its route timeout times out like a unary call. A
// call in flight on a stream that breaks fails at once (Unavailable: local
// fallback for a route, a unary retry for the idempotent Complete and Sync),
// and the stream reconnects with backoff (50 ms to 30 s; at most the breaker's
// probe interval while it is open, see below). A follower, or a leader that
// steps down, ends the stream with the NotLeader detail and the data plane
// reopens it on leader_url; a node without the RPC (Unimplemented) or an
// HTTP/1.1-only path leaves the data plane on unary calls, retried with
// backoff. The leader's API body read deadline does not apply to the stream,
// and a graceful shutdown ends open streams.
//
// # Completions ride with Route calls
//
// A data plane puts its queued completions (oldest first, at most 64) into its
// next Route call (RouteRequest.completions), once the leader's stream hello
// answer said it settles them (settles_riders: an older leader would ignore
// them, so it keeps getting Complete calls). The leader settles them in that
// decision's own lock hold, before deciding, and whatever the call's outcome.
// Only those no call carried within a report_interval_ms tick go in a Complete
// call of their own, at the tick after (so within two intervals); a Route call
// that fails, for any reason, puts its riders back, which is safe since
// settling a ticket twice is a no-op. Reports of abandoned calls never ride:
// on a later call they could reach the leader's lock before the call they
// name, which would then keep its load; they wait for an aged flush, which
// only the tick sends (a flush forced by 256 queued completions sends
// completions only, and ages nothing). At a route every few milliseconds per
// data plane nearly every completion rides: a stream message in and an answer
// out less each, and the leader's load view a route interval old instead of up
// to a tick (bench/results/2026-12-02-messages/).
//
// # Local fallback and the shadow index
//
// Router calls Route with dataplane.route_timeout_ms (20 ms); on timeout,
// connection error or Unavailable it routes to its least-loaded usable worker
// by its own in-flight counts with a random tie-break (reason fallback_local,
// cart_fallback_total{cause}), and rotates to the next control-plane node. The
// fallback is not cache-blind: a shadow index (the control plane's index type
// in process, 65,536 entries, inline LRU eviction) records block hashes →
// worker of every Route answer and of its own fallbacks, and fallback takes
// its longest good-enough match unless the balance rule says that worker is
// overloaded against the least-loaded one (measured,
// bench/results/2026-12-01-fallback: fault-phase hit ratio 30% → 90% with the
// control plane cut off, 32% → 86% with Route delayed 200 ms). It is a hint,
// never replicated; undelivered requests are not withdrawn from it. It keeps
// only the latest worker per block: remembering every worker a prefix was ever
// sent to made a group the control plane had spread over all replicas a
// four-way tie, broken by load, and the fallback hit ratio during a leader
// election fell to the blind 31% (65-73% with latest-only,
// bench/results/2026-12-01-failover).
//
// ResourceExhausted from the control plane ("no healthy workers", "all at
// max_load") is an answer, not a failure: it becomes a 503, not a fallback. It
// starts from the workers of its own config when no control plane is reachable
// at boot.
//
// # The placement feed
//
// With its own answers only, a shadow knows 1/N of the traffic of N data
// planes behind one load balancer: a conversation whose earlier turns went
// through other data planes is new to it. The placement feed
// (dataplane.route_stream_placement_feed, on with the Route stream) fixes
// that: the data plane's stream hello asks for it, the leader acknowledges it
// in the hello's answer (a data plane whose leader predates the feed keeps
// recording its own answers), and the leader
// (controlplane/service/placementfeed.go) keeps a ring of its last 16,384
// placements (only while a stream reads) and sends each stream, every 50 ms,
// the placements since its cursor — for every data plane, its own included, so
// the shadow records them in the leader's order (a data plane's own answer and
// a feed frame carrying an earlier placement for another data plane would
// otherwise arrive out of order; while the feed is live, answers are not
// recorded twice; placements of this data plane's abandoned calls, which the
// leader withdraws, are skipped by route id). A placement travels as its
// worker and the prompt's checkpoint hashes (index.Checkpoints: positions 0-7,
// every 8th after, and the last; each chained hash names its whole prefix), so
// a 10k-character prompt costs ~20 hashes, not 80; the shadow matches them by
// probing the same positions of its own prompt (index.LookupCheckpoints, at
// most 7 blocks short); the shadow stores its own records the same way, so
// that a fed placement replaces all of an earlier holder's entries for a
// prompt. A stream behind by more than 4,096 placements per tick skips the
// oldest (cart_cp_placement_feed_skipped_total). Cost on the leader: 1.1-1.6
// µs per placement for four streams, framing included
// (BenchmarkPlacementFeed), against 140-350 µs of leader CPU per route.
// Measured with cart-bench failover (bench/results/2026-12-01-feed): with 4
// data planes and 2,000 prefix groups the fallback during an election hits
// 97-98% with the feed, 75% without; the window containing the kill keeps
// 0.98-0.99× the steady hit ratio with it, 0.90-0.91× without.
//
// # The control-plane breaker
//
// A control-plane breaker (cpbreaker.go) keeps a slow or unreachable leader
// from adding the route timeout to every request: after route_breaker_failures
// (5) consecutive Route timeouts/Unavailable (answers such as
// ResourceExhausted reset the count) it stops calling Route and falls back at
// once (cause cp_breaker), lets one probe through per route_breaker_cooloff_ms
// (1 s) — per 100 ms after a call refused at once (a dead node, a follower
// that knows no leader during an election), which costs nothing to wait for
// and finds a new leader soon after its election — and closes on the first
// answer. Measured with Route delayed 200 ms: mean added latency 20.9 ms → 1.3
// ms. A data plane that learns a new leader (from a Sync or a Route answer's
// leader_url) resets the breaker: it judged the old leader. Failures count
// once per stall: a call already in flight when a failure was counted does not
// count again, so the breaker opens after route_breaker_failures rounds of
// calls, each started after the previous round failed (about 5 × the route
// timeout of trouble). Counted call by call, one stall of 20 ms at 5,000
// routes/s made every call in flight time out together and opened the breaker
// for a whole cool-off (1,250 fallbacks per data plane); see issue 13's
// control-plane runs.
//
// # Dead connections
//
// In issue 32, after a partition healed, a data plane fell back for ~12 s on
// an HTTP/2 connection that stayed silent until TCP's backed-off
// retransmission fired, while the stream's backoff had grown to 30 s. Now the
// control-plane client (cpclient, net/http's HTTP2Config, which covers h2 and
// h2c alike) sends a PING after 1 s without a frame and closes the connection
// when it is not answered within 1 s more. For a path whose PINGs are answered
// while calls are not (an HTTP/2 proxy in front of a dead upstream), as many
// rounds of Route timeouts in a row as open the breaker (counted once per
// stall, as above), each route_breaker_failures failed probes after, and a
// stream hello unanswered for 2 s close every connection to the node so the
// next call dials afresh (cpclient.Transport.DropConns,
// cart_cp_redials_total{why}). While the breaker is open the stream's retry
// backoff is capped at its probe interval, the probe that closes it redials
// the stream at once, and a stream that comes back lets the next call probe.
// Measured, three runs each, from the heal to the leader's first answer:
// TestPartitionFromLeaderHealsIptables (iptables DROP both ways for 7 s, in a
// network namespace of the test's own) 6.65-6.86 s before, 0.02-0.03 s after
// (a new stream in 0.02-0.04 s; before, the old stream never broke);
// TestPartitionFromLeaderHeals (in-process blackhole proxy, 4 s cut,
// connections silent 12 s after the heal) 12.7-13.0 s before, 0.54-0.56 s
// after.
package remote
