// Package affinity remembers which worker produced each stored Responses
// API response, and for which tenant, so that requests naming it
// (previous_response_id, GET /v1/responses/{id}) reach the one replica that
// keeps it in memory, and only when they come from the tenant that made it.
// Data planes key their table by response id, the control-plane leader by
// the id's hash (HashID), which is what data planes send it; both keep the
// tenant as its hash (HashTenant).
//
// How the proxy learns ids, pins requests and answers other tenants: package
// proxy (dataplane/proxy), Responses API affinity.
//
// The table is LRU-bounded (responses.max_entries), each entry expiring
// responses.affinity_ttl_secs after it was last learned or used (a
// conversation in use stays). Data planes key it by id, the leader by a 64-bit
// FNV-1a of the id (fixed-size entries whatever ids clients send). Each entry
// holds the worker and the tenant that made the response (FNV-1a of the client
// key's name, HashTenant).
//
// # Distributed mode
//
// Choice: the data plane that sees an answer reports (id hash, worker) to the
// leader in a Complete call carrying only response_origins, synchronously,
// before the id reaches the client (bounded by route_timeout_ms; one extra RPC
// per Responses answer, paid before the first byte of a stream — the
// response.created event, which engines send before generating). Batching it
// with the completions would race: a client may send the continuation to
// another data plane as soon as it holds the id, well before the next flush.
// Route then carries response_id_hash and tenant_hash; the leader excludes
// every other worker, marks the answer pinned (the data plane then keeps the
// pin for its retries and remembers it locally), fails FAILED_PRECONDITION
// when that worker left (the data plane answers 404
// previous_response_not_found), or NOT_FOUND with a ResponseNotFound detail
// when the response is another tenant's (the data plane answers the engine's
// 404). Stream answers carry error details too (StreamError.details), so the
// detail survives the Route stream. The tenant hash travels with every origin:
// in Complete, in PlaceBatch and in snapshot records. Each data plane also
// keeps its own table of what it saw and what the leader pinned, consulted
// first, so its own conversations stay pinned while it routes by local
// fallback. The leader also queues each origin into its next PlaceBatch Raft
// entry (alongside the placements), so followers fill their tables as they
// apply the log and a new leader keeps pinning conversations. Snapshots carry
// the table too (SnapshotHeader.response_origins: id hash, worker, tenant hash
// and expiry, most recently used first, listed off the routing lock, written
// as records of their own after the index so that the header stays small), so
// a node restored from one, or restarted, still pins ids made before it. A
// restore merges them behind what the node knew (facts stay true; an older
// snapshot adds nothing; a full table keeps its own, newer entries). Listing
// them holds the table's own lock (which pinned Routes and Completes with
// origins take) for a walk of it: ~1 ms at 100,000 entries, more when the
// garbage collector runs meanwhile (17-30 ms seen on a loaded box), once per
// snapshot. Choice: this replication is best effort, like the placements' hint
// value but without their undo ledger: an origin in a window that fails to
// commit is not proposed again (the leader and the reporting data plane still
// have it), and a follower's entry expires affinity_ttl_secs after it applied
// it, since lookups on the leader do not refresh followers. An id a new leader
// does not know is routed by prefix, and a replica without it answers 404.
package affinity
