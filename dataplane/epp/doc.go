// Package epp is CART's Endpoint Picker: envoy.service.ext_proc.v3.
// ExternalProcessor as the Gateway API Inference Extension's Endpoint
// Picker Protocol (docs/proposals/004-endpoint-picker-protocol, v1.0.0)
// defines it. A gateway opens one stream per HTTP request; the picker
// answers with the worker to use and the gateway forwards the request.
//
// # Routing is the proxy's
//
// A stream runs the proxy's own handler (dataplane/proxy) on a request
// rebuilt from the headers message (pseudo-headers to method, path and
// host; no remote address, so the proxy's loopback-only admin view stays
// closed), under proxy.WithPicker. Everything up to the decision is the
// proxy's code path: client keys, the body limit and budget, extraction,
// the media policy, the model filter, cache isolation, the Responses API
// pins, session keys, flow control, and the router (router.Local, or the
// control plane through remote.Router). Only where the proxy would
// dispatch does it hand the decision over (a proxy.Pick) and wait, holding
// it as an attempt is held, until the picker says how the exchange ended.
// What the handler answers itself (errors, GET /v1/models, /health) is
// recorded and sent as an ImmediateResponse, in the proxy's error shape.
//
// The body reaches the handler through a feed (feed.go) the stream's
// goroutine appends the gateway's chunks to. The feed holds at most a
// window (256 KiB) the handler has not read: past it the stream's
// goroutine waits, so gRPC's flow control holds the gateway back, and the
// body's memory is counted where the proxy counts it, in the handler's
// read (proxy.max_inflight_body_bytes). A reset still ends the wait (the
// stream's context), and once the handler has returned or picked, the
// rest of the body is dropped (the pick carries the body it read). The
// proxy's body read timeout reaches the feed through the recorder's
// SetReadDeadline, as it reaches a connection: a stalled body is the
// proxy's 408.
//
// # Message order
//
// FULL_DUPLEX_STREAMED both ways (other modes are refused: the picker must
// send the body back, since in that mode the gateway forwards what the
// picker sends). The picker answers once the decision is made and the
// request body complete (end_of_stream, or trailers): the headers response
// (destination header and envoy.lb metadata, equal; clear_route_cache),
// the body in chunks of at most MaxChunk bytes, the last one ending the
// stream unless trailers follow, then the trailers' response. Response
// messages are answered one for one as they come: headers (x-routed-peer),
// each body chunk sent back as it came, trailers.
//
// # Settlement
//
// A decision is settled exactly once (proxy.Pick): at the response's end
// of stream with the usage read from its head and tail (the proxy's
// sniffing), undelivered at once when the gateway's served report names
// another endpoint (it fell back; the chosen worker never saw the prompt),
// or as a client that hung up when the stream breaks off. A request the
// picker never answered is settled undelivered.
//
// # What was checked against what
//
// Field names, message shapes and modes: go-control-plane's generated
// types (envoy v1.40.0). The protocol's keys, the subset hint and served
// report, the 503/429 rules, the health-check names: the proposal's text.
// The answer's order (headers response held until the body is complete,
// the body always sent back in 62,000-byte chunks, one chunk echoed per
// response chunk, trailers answered): llm-d-router's pkg/epp/handlers.
//
// # Why a hook and not a second path
//
// cart epp answers a gateway's ext_proc streams (Gateway API Inference
// Extension) with the worker to use instead of proxying. It is an all-in-one
// router or a data plane whose HTTP listener is replaced by a gRPC server
// (server.NewEPP); nothing about routing is its own. The alternative, an
// exported "prepare" API the picker calls step by step, would have split the
// proxy's straight line in two and let the two paths drift; the hook is one if
// in forward plus picker.go. Whatever the handler answers itself becomes an
// ImmediateResponse in the same JSON error shape (with Retry-After and
// WWW-Authenticate), and the handler's deferred buffers and body budget are
// released when they would be for a proxied request. Breakers hear of the
// worker's status as for a proxied attempt; retries are the gateway's.
//
// # Fallbacks
//
// Fallbacks (epp.fallback_endpoints, default 0) are chosen by the picker from
// the router's worker view (prefix candidate first, then least loaded, random
// ties), not by the routing core: they carry no load until the served report
// says one was used, which is why the default is none. ORIGINAL_DST, the
// simplest Envoy wiring, reads one address anyway.
//
// # Active-active
//
// Pickers asking the control plane share its index and load view exactly as
// data planes do: the e2e test measures the same hit ratio through one picker
// as through one data plane, and through three pickers as through one.
//
// # Cost
//
// A request on the picker path is four to five gRPC messages each way on one
// stream (headers, body, response headers, response body chunks, end) where
// the proxy does one HTTP round trip to the worker:
// bench/results/2026-12-07-epp measures the CPU and latency it adds.
//
// Configuration, the protocol as a gateway sees it, and Envoy wiring:
// docs/endpoint-picker.md.
package epp
