// Package wire holds the parts of the control-plane API contract that the
// proto cannot carry (metadata keys, their values, size limits), so that
// the server (controlplane/service) and its clients (cartctl) spell them
// once. It imports nothing: a client takes these without the server.
package wire

// MaxMessageBytes bounds every request message the control plane reads.
// Clients refuse longer input up front rather than after uploading it.
const MaxMessageBytes = 4 << 20

// HeaderWriteOutcome is error metadata set to OutcomeUnknown (code Aborted)
// when the control plane cannot tell whether a write took effect.
// Commands are idempotent: the client repeats the call, on any member,
// until it gets a definite answer.
const HeaderWriteOutcome = "Cart-Write-Outcome"

// OutcomeUnknown is the HeaderWriteOutcome value for "may or may not have
// been applied".
const OutcomeUnknown = "unknown"
