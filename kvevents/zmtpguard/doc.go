// Package zmtpguard puts bounds around the ZMQ sockets (go-zeromq/zmq4) that
// read KV events from engines, so that no peer can crash or exhaust the
// process that reads them.
//
// # Why
//
// zmq4 (v0.17.0) allocates a frame's body from the length its header claims
// before reading it (conn.go: make([]byte, size)): one 73-byte frame whose
// header claims 2^62 bytes panics with "makeslice: len out of range" in a
// reader goroutine CART does not own, which ends the process, and a header
// claiming a few GiB allocates them. Its NULL handshake also parses the
// peer's READY metadata without bounds checks (a short property slices out
// of range in the accept goroutine), handshakes each accepted connection
// synchronously and without a deadline (a silent peer stalls every later
// connection), and leaves a connection whose handshake failed open.
//
// # How
//
// zmq4 lets a program register transports (RegisterTransport) and choose a
// socket's security mechanism (WithSecurity); this package uses both and
// changes nothing inside zmq4:
//
//   - Transports "guarded-tcp" and "guarded-ipc" (Endpoint maps tcp:// and
//     ipc:// to them) wrap every dialled and accepted connection in a reader
//     that follows the ZMTP 3 stream as it arrives: it checks the greeting,
//     and holds back each frame header until it has read it whole and found
//     the announced size within MaxMessageBytes (per frame and per message)
//     and the message within MaxFrames. zmq4 only ever sees headers that
//     passed; a violation closes that connection, with a log line and a
//     reject callback. Frame bodies pass through without a copy.
//   - A connection must finish its handshake (greeting and READY) within
//     HandshakeTimeout, else it is closed.
//   - Accepted connections are refused beyond MaxConns at once, and from
//     source addresses outside Allow (when set). An ipc:// socket file is
//     set to IPCMode.
//   - Security is a NULL mechanism (the only one engines speak) whose READY
//     metadata parser checks every length, recovers from any panic, and
//     closes the connection on failure.
//
// The limits travel to the transports in the context given to the zmq4
// socket (Context): zmq4 hands its socket context to Listen and Dial.
//
// Measured: the checker adds one small read per frame header and none per
// body byte (BenchmarkGuardedRead in this package).
//
// # Measured and tested
//
// Bodies pass through without a copy: zmq4 reading 2 KiB messages takes
// 7.9-10.8 µs bare and 9.0-9.3 µs guarded (BenchmarkGuardedRead). CART's
// defaults: kv_events.max_message_bytes (4 MiB) per frame and per message, 16
// frames, a 3 s handshake, kv_events.max_publisher_connections (128). Every
// event socket goes through these transports: the subscriber, the replay
// dealer and cart-sim's publisher. The subscriber's own goroutine (package
// kvevents) recovers from a panic in one message (its topic's streams count as
// lost). ZMTP framing, the handshake (run through zmq4's own reader) and the
// event decoder are fuzzed, seeded with the crashing frame. Choice: no fork of
// zmq4, since registering transports and a security mechanism reaches every
// place a peer's bytes are read.
package zmtpguard
