// Package discovery turns what a worker source (DNS records, or a
// Kubernetes Service's EndpointSlices or labelled pods) reports into
// changes of the worker set.
//
// The Reconciler is pure: it is fed answers and the time, and says which
// endpoints to add, drain, undrain and remove, so damping and draining are
// table-testable. The Watcher does the I/O: it asks a Resolver on an
// interval that follows the answers' TTLs (and, for a watching Resolver,
// as soon as it says something changed, at most every MinInterval) and
// applies the Reconciler's verdicts to a Sink (the all-in-one router's
// engine, or the control plane's replicated worker set through Raft).
//
// Rules:
//   - An endpoint is added once it was present in AddAfter consecutive
//     answers (1 = at once).
//   - A member absent from RemoveAfter consecutive answers drains: it takes
//     no new requests; it is removed once its in-flight load is 0, or after
//     DrainTimeout whatever its load. If it comes back while draining, it is
//     undrained and stays.
//   - An answer that is an error or empty changes nothing (the last good
//     set stays) and marks the source stale until the next usable answer:
//     a broken resolver must never empty the pool. Scaling a source to zero
//     is therefore not followed; remove the last workers with cartctl.
//
// # Who runs it
//
// Discovery runs on the leader only: a pure reconciler (damping, drain, stale
// answers; table-tested with an injected clock) fed by a DNS watcher. Worker
// changes are ordinary upsert/remove entries whose WorkerSpec carries source:
// dns; draining is leader soft state (the watcher undrains on stepping down
// and the next leader recounts absences from its replicated set). On a
// bootstrapping node the watcher waits for the static seed, which only lands
// on a cluster with no worker history.
//
// # Discovered endpoints are not the operator's word
//
// A DNS record or an EndpointSlice naming 127.0.0.1:port or 169.254.169.254
// used to become a worker and receive prompts, probes and the pool's worker
// key. The watcher screens every answer through a pure policy (address.go,
// table-tested): unspecified and multicast addresses and the process's own
// bind addresses (an unspecified bind stands for every address of the host's
// interfaces, read when a watcher starts) are always refused; loopback and
// link-local are refused unless discovery.allowed_networks lists a network
// inside those ranges (a wide network such as 0.0.0.0/0 does not open them);
// with the list set, nothing outside it is admitted. Each refused endpoint is
// logged once per watcher run and counted on every answer
// (cart_discovery_refused_total{source,reason}); an answer with nothing left
// is an error, so the last good set stays, as for an empty answer. The pool's
// worker key is separately limited to trusted sources: the source travels with
// the worker (the replicated WorkerSpec.source, the Route answer's
// worker_source, the data plane's synced set for older leaders, unknown, never
// trusted, when none knows).
//
// Known limit: discovery sees bind addresses, not what forwards to them. The
// own-listener check knows the process's bind addresses and its host's
// interface addresses; a NAT, a Docker port mapping or a Kubernetes Service
// VIP in front of a control-plane port is not recognised (the loopback and
// allowed-networks checks still apply). The default refusal covers
// 169.254.0.0/16 and fe80::/10, not metadata services on other addresses
// (AWS's IPv6 one is fd00:ec2::254): set discovery.allowed_networks to the
// workers' networks where that matters.
//
// What operators configure and see: docs/discovery.md.
package discovery
