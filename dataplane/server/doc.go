// Package server assembles a data-plane HTTP server from a configuration
// and a router: the proxy, health checks, breakers, metrics, limits and
// graceful shutdown. The all-in-one mode and the distributed data plane
// both run through here; only the Router differs.
//
// # The client listener is net/http
//
// Go's net/http serves the proxy port, HTTP/1.1, h2c with prior knowledge and
// HTTP/2 over TLS, and decides how every request is framed. CART had a loop of
// its own for the common HTTP/1.1 request (dataplane/h1server,
// server.own_http1_loop) until issue 35: it saved about a fifth of the CPU per
// request on a tiny-request benchmark, but it was a second parser deciding
// what to hand to the first, the classic request-smuggling surface, and it
// would not receive the fixes net/http gets. The key is refused with that
// reason. TestClientListenerFraming sends the framing tricks (two lengths,
// length and chunked, folded or doubled codings, bad chunk sizes, missing or
// doubled Host, control bytes) to the assembled server, each followed by a
// pipelined request that must never be served. What it cost, in three
// alternating runs of cart-bench alternate ... -- overhead
// (bench/results/2026-12-07-lighter/): CART's CPU per request 46 → 56 µs
// (medians of nine rounds), its throughput 0.82× → 0.71× nginx's, and still
// 1.31× Caddy's (Caddy at 85-90 µs per request); the goal is at least Caddy's.
package server
