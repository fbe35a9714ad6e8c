// Package raftnode runs the control plane's Raft node: hashicorp/raft over
// the replicated state machine of package state, with a WAL (or bolt) log, file
// snapshots and an optionally mutually authenticated TLS transport.
//
// Writes go through Apply on the leader. The leader's services must start
// only once everything committed by earlier leaders has been applied
// locally, so the node reports leadership (IsLeader, the onLeadership
// callback) only after a barrier in the new term.
//
// # Log, timing and versions
//
// Timing (controlplane.heartbeat_timeout_ms etc.): 500 ms by default (half of
// hashicorp/raft's LAN defaults) because data planes fall back locally during
// an election anyway and a faster election shortens the period of degraded
// routing. Measured: a new leader answers Route ~1.3 s after a kill -9 of the
// old one on loopback.
//
// The log store (controlplane.log_store): a new data dir gets
// hashicorp/raft-wal (append-only segment files, one fsync per append,
// truncation by deleting whole segments); a data dir keeps the log it holds,
// so nodes upgraded from bolt stay on bolt (raft.db), and naming the other
// kind is refused with the way to move (cart controlplane migrate-log for a
// stopped node: copy into wal.migrating/, check every entry, rename to wal/,
// only then move raft.db aside, so an interruption leaves the bolt log or
// both, which Start refuses, never neither; or empty the dir and rejoin).
// Rollback: a release before the WAL reads only raft.db, so on a WAL node it
// would start with no term or vote (it could vote twice in a term) or, with
// bootstrap, found a second cluster; log_store: bolt keeps a fleet
// rollback-safe until an upgrade is final. Against bolt, in alternating
// three-node runs (bench/results/2026-12-02-wal, medians of 7): followers 54 →
// 38 CPU µs per route at 5,000/s, closed loop 6.2k → 7.5k routes/s, leader 124
// → 103 µs per route there. A data-dir lock (flock on LOCK) makes a second
// node on the same directory fail at once: the WAL opens its metadata bolt
// file without a timeout.
//
// raft-wal is young: v0.4.0, called experimental by its authors and shipped by
// HashiCorp in Consul. Its Close leaves its metadata file open and it opens
// that file without a lock timeout; CART closes it and locks the data dir
// itself. controlplane.log_store: bolt keeps raft-boltdb.
//
// Versions: hashicorp/raft v1.7.3 with raft-boltdb/v2 v2.3.1, raft-wal v0.4.0
// and go-metrics v0.5.4 (raft v1.8.0 does not build with raft-boltdb/v2).
//
// # The Raft port: peer authentication
//
// The Raft listener carries the replicated worker set: whoever speaks Raft to
// a node can win an election with a forged log and point every data plane at
// their own "worker" (which then receives every prompt). hashicorp/raft trusts
// the ids and addresses inside its RPCs, so the transport must authenticate
// peers before the first RPC.
//
// Choice: a handshake keyed by a Raft token that only control-plane nodes
// hold, not the cluster token and not per-node certificates. The handshake was
// first keyed by the cluster token, which every data plane holds too, so any
// data plane (the role facing clients) could append entries and replace the
// worker set (issue 33, attack #2). The Raft token (auth.raft_token /
// auth.raft_token_file) is a fourth credential: Validate refuses it in a
// data-plane or all-in-one config and refuses it equal to any other
// credential, so the cluster token opens nothing on the Raft port. Per-node
// mTLS identities with a pinned CA were the alternative; a shared Raft token
// keeps what made the handshake the default (no CA, no certificate lifetime or
// rotation, no join-time issuing protocol, no clock) and fixes the actual hole
// — a secret held outside the control plane — with one more file per node.
// What per-node certificates would add, that a node cannot claim another's id,
// matters only among control-plane nodes, which are equally trusted
// (docs/security.md, known limits). Mutual TLS stays available
// (controlplane.raft_tls with client_ca_file, operator-supplied certificates;
// use a CA that signs control-plane certificates only) and combines with the
// handshake, which then runs inside TLS.
//
// The handshake (handshake.go), on every connection in both directions, before
// any Raft byte and inside TLS when raft_tls is on:
//  1. dialer → listener: CARTRFT2, a 32-byte random nonce, its node id;
//  2. listener → dialer: CARTRFT2, its own fresh nonce, its node id, and
//     HMAC-SHA256(K, "listener proof" ‖ both nonces ‖ both ids);
//  3. dialer verifies it (constant time), answers with the same MAC under the
//     "dialer proof" label;
//  4. listener verifies it and sends one ack byte; only then does raft see the
//     connection.
//
// K = HKDF-SHA256(raft token, info "cart raft peer authentication v2 (raft
// token)"): the MAC key is not the token itself. The listener proves first, so
// a dialer never sends its proof to an impostor; role labels stop a proof
// being reflected back as the other role's; each side's fresh nonce makes a
// recorded exchange worthless on a new connection (test:
// TestHandshakeReplayFails). The claimed node id is bound into the MAC and
// logged; it is not matched against the ids inside later Raft RPCs, because
// with one shared key it is a claim of a token holder, not an identity
// (docs/security.md).
//
// Rolling upgrade. Releases before the Raft token spoke the same exchange as
// CARTRFT1, keyed by HKDF(cluster token, "cart raft peer authentication v1")
// with v1 labels. The dialer's magic names the generation it proves; a
// listener answers in that generation or closes after 8 bytes. A node with
// auth.raft_accept_cluster_token holds both keys: it accepts v1 as well as v2,
// and dials a peer with the generation that last worked for that address (v2
// for a new one), switching to the other on a fresh connection when the peer
// refuses — an old node closes a v2 hello, a node without the setting closes a
// v1 one. Such a node logs each peer still on v1 (at most one line per 10 s).
// So the upgrade is two rolling restarts, the cluster serving throughout:
// every node onto the new release with the setting, then every node without it
// (docs/security.md). Mixed clusters work at every step
// (TestRollingUpgradeToRaftToken: old v1-only nodes, transition nodes, an
// upgraded leader reaching an old follower, then the setting removed node by
// node, on real TCP and disk; TestRaftTokenTransitionThenStrict with real
// processes). While any node has the setting, the cluster token opens that
// node's Raft port, as before.
//
// Listener hygiene: inbound connections are authenticated on their own
// goroutine under controlplane.raft_handshake_timeout_ms (5 s) before raft's
// transport gets them (raft gives each accepted connection a 256 KiB buffer
// and a goroutine with no deadline), and at most controlplane.raft_max_conns
// (256) inbound connections exist at once, authenticating or established;
// beyond that a new one is closed at once. Refused connections are logged with
// the remote address at WARN, audit=true, rate-limited (burst 5, then 1/s,
// with a count of what was dropped). Measured with 1,000 idle connections to a
// node's Raft port (loopback, cart controlplane with a token): before, 1,012
// fds held indefinitely and RSS 18.6 → 29.5 MB; now 268 fds for at most the
// handshake deadline, then 12, RSS 18.7 → 20.5 MB
// (TestRaftListenerBoundsIdleConnections).
//
// What a network attacker can do with and without the token, and how to turn
// the handshake on: docs/security.md.
package raftnode
