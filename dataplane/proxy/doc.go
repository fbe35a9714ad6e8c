// Package proxy is the data plane's HTTP front: it reads and checks a
// request, extracts its prompt key, asks a router.Router where to send it,
// and streams the worker's answer back, retrying on another worker while no
// byte has reached the client. The same Proxy runs in the all-in-one mode
// (with an in-process router) and in a data plane (with the control-plane
// client); it never knows which.
//
// # Attempts and retries
//
// Retries happen inside the proxy's retry loop (roundTrip): when it returns,
// relay starts writing to the client, so by construction no retry can happen
// after a byte was sent. The proxy forwards on its own rather than through
// httputil.ReverseProxy (which cloned every request and then deleted most of
// the copy): it drops hop-by-hop headers (and those that Connection names)
// both ways, never forwards client credentials or Expect, sets
// X-Forwarded-For/Host/Proto, passes 1xx answers and trailers on, and flushes
// after every chunk only for text/event-stream and unknown-length answers.
// Each attempt re-routes with every failed worker excluded. The body is
// buffered once (we read it for the key anyway) and replayed.
//
// Retry budget: retries in progress ≤ retry_budget_ratio × requests in flight,
// floor retry_budget_min (Envoy's shape). When out of retries the last
// worker's own answer (e.g. its 503) is passed through rather than replaced by
// ours.
//
// Circuit breaker per worker, driven by real traffic. Choice: a breaker alone
// never takes the last usable worker out: if every healthy worker's breaker is
// open, the request is routed ignoring breakers (a trial) rather than refused.
// Open breakers travel to the router as a soft avoid list
// (router.Request.Avoid, RouteRequest.avoid_workers): the decision core keeps
// them out unless that leaves nobody and flags the trial, so a trial costs one
// Route call. /workers reports a breaker whose timeout has passed as half_open
// (the next request would be a trial), and a health check that turns green
// again half-opens an open breaker at once, so a replica that recovered while
// no traffic flowed is neither shown nor treated as open until its timeout.
// Refusing everyone turns a partial outage into a total one; the trial is also
// how the pool recovers. Health checks, by contrast, do remove workers,
// because they are an explicit signal.
//
// Load is released exactly once by a body wrapper whose Close relay calls on
// every path (normal end, client abort via http.ErrAbortHandler, error). A
// client hang-up is logged as 499, never counted against the worker's breaker,
// and keeps the placement.
//
// proxy.connect_timeout_secs bounds dial + TLS handshake only.
// proxy.request_timeout_secs bounds dispatch until response headers
// (ResponseHeaderTimeout); after that, streams are bounded only by
// proxy.stream_idle_timeout_secs, a timer reset on every chunk. A
// whole-response deadline would kill legitimate long generations.
//
// # Usage
//
// Usage (prompt_tokens, prompt_tokens_details.cached_tokens, Anthropic's
// cache_read_input_tokens) is read from the first 2 KiB and last 4 KiB of the
// response as it streams past, without parsing the body, to compare predicted
// and actual cache hits. Choice: a report without cache fields is "unknown"
// (cached = -1), never "0 cached": vLLM omits them unless started with
// --enable-prompt-tokens-details (and always on /v1/messages), and reading
// that as misses had the closed loop shrink a replica with a 97% real hit
// ratio below one system prompt. Unknown reports feed neither the closed loop,
// the accuracy counters nor cart_cached_*.
//
// # Memory budgets
//
// The threat: any client that can reach the proxy port (or, for the
// control-plane API, any caller, since the body is read before the handler
// runs) sends large, numerous, slow or highly structured requests to exhaust
// memory. Each budget bounds one multiplier:
//
// Bytes in flight (proxy.max_inflight_body_bytes, 256 MiB): one atomic counter
// for all requests. A declared Content-Length is reserved in full before the
// body is read (over budget → 503 + Retry-After: 1, connection closed so
// net/http does not drain the body); a chunked body reserves each buffer
// before allocating it and is refused as soon as it stops fitting. Bytes are
// given back when the final answer starts (no retry can follow, and a long
// stream must not count against new uploads; the replay reader drops its
// reference on Close so the buffer really becomes garbage) or when the handler
// ends. Refused, not queued: a queue of stalled uploads is the attack.
//
// Decode amplification (proxy.max_messages, 10000): an empty message is 3
// bytes of JSON and over 100 bytes decoded (plus slice growth; a number in
// messages decodes to a whole struct too). A single pass over the bytes
// (items.go, no allocation, separate from extract) counts every array element
// at any depth and refuses the request with 400 before it is decoded. Number
// elements of an all-number array under the top-level prompt are token ids,
// which extract reads without decoding, so they do not count.
//
// Time (proxy.body_read_timeout_secs, 30;
// controlplane.api_body_read_timeout_secs, 10): a socket read deadline while
// the body is read, lifted afterwards so slow handlers and long streams are
// unaffected (unlike http.Server.ReadTimeout, which for HTTP/1 keeps running
// during the handler).
//
// Measured with e2e/attacks/body_budget.sh (real binaries, two cart-sim
// replicas, defaults): four concurrent 30 MiB bodies of 1.1M empty messages
// peaked at 1551 MB RSS and took 118 s before; now they are refused (400) at
// 140 MB peak in under 3 s. Ten stalled 33 MB uploads: 324 MB before, 263 MB
// now (eight fit the 256 MiB budget, two get 503), 80 MB with a 64 MiB budget.
// Peak RSS is roughly the idle RSS plus the budget plus what is decoded from
// admitted bodies. Idle, the all-in-one router of make run (default 1M-entry
// index) holds 58 MB, against 37 MB before the index's 16 MB hash table was
// mapped up front (grep VmRSS /proc/PID/status 3 s after start).
//
// # Pass-through
//
// Pass-through is an allowlist (proxy.pass_through_paths, inference APIs by
// default; clean paths only, so dot segments cannot climb out of a prefix):
// engines serve their admin API on the same port as inference. A POST to a
// non-built-in path is never resent after a worker may have received it (only
// a refused connection is retried), since it may not be idempotent.
//
// Pass-through bodies get the body budget but not the item cap, by design:
// CART never decodes them (only the allocation-free media walk and a one-field
// read of model for model routing), so there is no decode amplification to
// bound, and /tokenize-style token arrays are legitimately long.
//
// # Responses API affinity
//
// POST /v1/responses is a routed endpoint like chat: its key is instructions
// then one record per input item, in the chat notation (a string input equals
// the chat user message), with item ids and statuses left out so that a
// conversation replayed in full extends the earlier key. What prefix routing
// cannot do is previous_response_id: vLLM keeps stored responses in the memory
// of the replica that made them, so a continuation, and GET/DELETE
// /v1/responses/{id} and cancel, work on that replica only.
//
// Learning. The proxy wraps every successful Responses answer in a reader that
// copies its first bytes (at most 8 KiB) until the first "id" member whose
// value starts with resp_ shows up — the Response object's own id, first field
// of the JSON body and of the response.created event — and records id → worker
// before handing those bytes on. Nothing is buffered: the stream goes out
// chunk by chunk as before. Because the record precedes the bytes, no client
// can hold an id CART does not know yet.
//
// Pinning. A request naming a known id may go to that worker only: every other
// worker is put in the request's exclusion list, read afresh at each attempt
// (a worker added meanwhile is no way around it). This reuses the engine's
// ordinary rules, so a pinned worker at max_load, unhealthy or failed on an
// earlier attempt yields 503 (response_replica_unavailable), never another
// replica — which would only answer 404. A worker no longer in the pool yields
// 404 previous_response_not_found: the response is gone with it, and saying so
// beats sending the id to a replica that never saw it. An unknown id is routed
// by prefix: it may predate a restart of CART, and the replica that made it
// may well be the one the prefix picks.
//
// Tenants. The engine has no notion of tenants: whoever holds an id can read,
// delete, cancel, list or continue the response. So a request from another
// tenant than the entry's is answered by CART with exactly vLLM's answer for
// an id its store does not hold (_make_not_found_error: 404,
// invalid_request_error, param response_id, numeric code 404) and reaches no
// worker. The same answer, rather than a distinct 403, so that a tenant learns
// nothing from it about other tenants' ids; checked before "the worker left
// the pool", which would say the id exists. A lookup by another tenant does
// not refresh the entry (it can neither keep it alive nor save it from
// eviction). The {id} of /v1/responses/{id} is one path segment that ServeMux
// matches escaped and hands over decoded, so resp_x%2F..%2F..%2Fsim%2Fstats
// decoded to a path out of /v1/responses/ once the outbound URL was built from
// the decoded path: ids must be [A-Za-z0-9_-]{1,256} (vLLM's are resp_ and 32
// hex digits) or get the same 404, and every outbound path is now built from
// the escaped form (RawPath joined, not cleared), so an escaped / anywhere
// reaches the worker escaped.
//
// # Tenants and the prefix cache
//
// Stored Responses API responses answer only their own tenant (above). The
// prefix cache is shared by default — that is what makes routing pay — so a
// tenant replaying another's prompt sees the hit (cached_tokens, a faster
// first token) and learns what was sent; auth.client_keys[].isolate_cache
// closes that for the tenants that need it. Choice: the salt is derived, not
// configured. HMAC-SHA256 keyed by the tenant's client key of a fixed label is
// the tenant's salt secret; a request's cache_salt is HMAC-SHA256 of the
// client's own salt ("" if none) keyed by that secret, base64url (256 bits, as
// vLLM advises). No new secret to distribute, every data plane computes the
// same salt, no other tenant can produce it (it would need the key), and a
// client salt still splits the tenant's own cache without leading out of it.
// The body is rewritten to set it (extract.SetCacheSalt: every top-level
// member named cache_salt after unescaping is dropped, one is appended, every
// other member keeps its bytes), so the engine, which keeps the last of
// repeated names, reads CART's value; the index hashes with the same salt. The
// rewrite costs an isolated tenant's request a copy of its body: 294-403 µs
// and 3 allocations for a 105 KB chat body, against 171-213 µs to extract its
// key (go test -bench 'SetCacheSalt|ExtractChat100K' -count 3
// ./dataplane/extract, on a 2-core box at load 7-10). vLLM reads cache_salt on
// chat completions, completions and responses only (its Messages request model
// has no such field), so /v1/messages is refused for an isolated tenant rather
// than sent unisolated. Cost: no shared prefix with other tenants, a common
// system prompt included; a new key starts a cold cache. A client's
// X-Request-Id is never CART's request id (it would let a tenant collide with
// another tenant's requests in the logs and the engine's): CART generates one
// for every request and logs the client's, sanitized and bounded, as
// client_request_id.
//
// # Prefill/decode legs
//
// The proxy runs the legs of a split request (pd.go; the engine chose the
// pair), each an attempt of its own (breaker, in-flight gauge, tracing,
// settlement), so the retry loop needs no second implementation: a failed
// prefill leg is put down to its worker (attempt.blame) and the next begin
// asks for a pair again without it. A decode leg's kv_transfer_params are kept
// for its retry only while the first decode worker provably never took them
// (dial refused, or a retryable status before it processed anything): NIXL
// frees the prefill engine's blocks once a decode engine has read them, and a
// second reader of freed blocks would read whatever was allocated there since.
// The bodies of the legs are built by extract.RewriteMembers (one walk over
// the top-level members, every spelling of a name replaced, as Python reads
// them); the prefill answer's kv_transfer_params are passed on as the bytes
// the engine wrote. In a split pool CART owns the field: a client could
// otherwise point a decode engine's NIXL handshake at any host, or at blocks
// another request left on a prefill engine.
//
// What vLLM does with a transfer nobody claims: the prefill engine's NIXL
// connector holds the blocks of a finished prefill until a decode engine reads
// them or VLLM_NIXL_ABORT_REQUEST_TIMEOUT (480 s) passes; there is no API to
// release them early. CART's side settles both tickets, so no load or
// placement leaks; cart-sim models the hold (--kv-hold-secs) and exports what
// it holds (sim_kv_transfers_pending), which the failure tests watch go back
// to zero.
//
// Measured (cart-bench pd, bench/results/2026-12-07-pd): the prefill choice is
// where cache-awareness pays; see that README for the figures and what
// cart-sim does not model (prefill/decode interference within one engine's
// batch, which is what disaggregation removes), so TTFT there compares
// capacity, not interference.
package proxy
