// Package router defines how the data plane asks where a request goes, and
// the in-process implementation used by the all-in-one mode. The proxy
// depends only on the Router interface, so it cannot tell whether the
// decision came from an embedded engine or a remote control plane.
package router

import (
	"context"
	"errors"
	"time"

	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
)

// Request is one routing question from the proxy.
type Request struct {
	ID       string // request id, for logs
	Endpoint string // extract.Endpoint name, "" for pass-through traffic
	Model    string
	// Hashes and KeyLen describe the key text (index.Hash); empty for
	// traffic that is not prefix-routed.
	Hashes []uint64
	KeyLen int
	// Exclude are worker URLs this request must not go to.
	Exclude []string
	// Avoid are worker URLs to keep out unless nobody else can take the
	// request (open circuit breakers): then the router ignores them and
	// sets Decision.AvoidIgnored, in the same call.
	Avoid  []string
	DryRun bool
	// Session is the request's session key ("" = none).
	Session string
	// ResponseID names the stored Responses API response the request
	// continues or reads ("" = none). A router that shares response
	// affinity between data planes pins the request to the worker that
	// produced it (Decision.Pinned), or fails with ErrResponseGone, or
	// with ErrResponseNotFound when it belongs to another tenant.
	ResponseID string
	// Admission is what flow control knows of the request: when every
	// worker it may use is saturated, it waits by these (tenant, priority,
	// deadline), and Route returns once a worker takes it or flow control
	// refuses it (ErrRefused).
	Admission Admission
	// Tenant is the client key's name the request came with, for
	// ResponseID's owner check ("" when ResponseID is).
	Tenant string
	// Disagg says whether the request may be split between a prefill and
	// a decode worker (engine.DisaggPair), or needs a decode worker only
	// (engine.DisaggDecode: its prefill is done); zero routes it whole.
	Disagg Disagg
}

// Disagg is how a request may be split (engine.Disagg).
type Disagg = engine.Disagg

// How a request may be split, for callers that keep out of the routing
// core (the proxy).
const (
	DisaggNone   = engine.DisaggNone
	DisaggPair   = engine.DisaggPair
	DisaggDecode = engine.DisaggDecode
)

// Why a request that could have been split went whole (Decision.Whole).
const (
	WholeShortPrompt = engine.WholeShortPrompt
	WholeNoPrefill   = engine.WholeNoPrefill
	WholeNoDecode    = engine.WholeNoDecode
)

// Admission is a request's flow-control identity (decider.Admission).
type Admission = decider.Admission

// RefusedError is a flow-control refusal: 429 with Retry-After.
type RefusedError = decider.RefusedError

// ErrRefused marks flow control's refusals.
var ErrRefused = decider.ErrRefused

// Flow control's refusal reasons (RefusedError.Reason).
const (
	RefusedShed       = decider.RefusedShed
	RefusedTimeout    = decider.RefusedTimeout
	RefusedQueueFull  = decider.RefusedQueueFull
	RefusedTenantFull = decider.RefusedTenantFull
)

// Decision is where a request goes and why. The Ticket must be handed back
// to Done exactly once (for non-dry-run decisions).
type Decision struct {
	Worker       string
	Reason       string
	MatchedChars int
	MatchedRatio float64
	Candidate    string
	// ChosenChars is the prefix the index believes Worker already holds.
	ChosenChars int
	// Latency is how long the decision took, measured by the decider.
	Latency time.Duration
	// FromLeader is true when an authoritative control plane leader (or the
	// embedded engine) decided, false for a local fallback.
	FromLeader bool
	// Ticket carries what Done needs to release the decision: one type
	// for every router, so a decision handed to the wrong one is refused
	// and counted rather than a silent no-op.
	Ticket Ticket
	// Pinned: Worker holds the stored response named by
	// Request.ResponseID, and only it can serve the request.
	Pinned bool
	// AvoidIgnored: every usable worker was in Request.Avoid, so the
	// router ignored it and this decision is a trial.
	AvoidIgnored bool
	// Waited is how long the request waited for a worker with room
	// (flow control; 0 when it did not wait).
	Waited time.Duration
	// Source is where Worker came from (static, admin, dns, kubernetes;
	// "unknown" when the router cannot tell): the proxy sends the pool's
	// worker key only to workers of the sources trusted with it.
	Source string
	// Prefill is the prefill leg of a split decision (Reason pd): its
	// worker computes the prompt and took a unit of load of its own, held
	// by its own Ticket. Done must be called for it too, exactly once,
	// when the prefill leg ends. Worker is then the decode worker.
	Prefill *Decision
	// Whole says why a request that could have been split went whole
	// (engine.WholeShortPrompt...); "" otherwise.
	Whole string
}

// SourceUnknown marks a decision for a worker whose source the router does
// not know: no source-dependent trust applies to it.
const SourceUnknown = "unknown"

// Ticket is a decision's claim to settle (decider.Ticket): a router fills
// ID and Worker for decisions made elsewhere (a remote control plane, a
// local fallback).
type Ticket = decider.Ticket

// Outcome reports what happened to a routed request (decider.Outcome).
type Outcome = decider.Outcome

// WorkerStatus is the router's view of one worker.
type WorkerStatus struct {
	URL     string
	MaxLoad int
	// Concurrency is the worker's concurrency limit in force (declared
	// max_concurrency, or learned from its engine; 0 unknown).
	Concurrency int
	LoadPenalty int
	Healthy     bool
	Load        int
	// Source is where the worker came from (static, admin, dns, kubernetes).
	Source string
	// Role is the part of requests the worker serves.
	Role engine.Role
	// Draining workers take no new requests while in-flight ones finish.
	Draining bool
	// Model accuracy: what the index predicted as cached vs what the
	// worker reported, and the current modelled capacity.
	PredictedCachedTokens uint64
	ActualCachedTokens    uint64
	CacheMisses           uint64
	ModelCapacityBlocks   int
	// KVEvents is the worker's engine-reported cache while its KV events
	// drive the model (nil otherwise; controlplane/kvtruth).
	KVEvents *engine.KVState
}

// Router decides routes and accounts load.
type Router interface {
	// Decide picks a worker and takes one unit of load on it.
	Decide(ctx context.Context, req *Request) (Decision, error)
	// Done releases the decision's load and settles its placement. It must
	// be called exactly once per successful non-dry-run Route.
	Done(d Decision, o Outcome)
	// Workers lists the current worker set.
	Workers() []WorkerStatus
}

// QueueReporter is implemented by routers that hold the flow-control queue
// in process (the all-in-one router), for /workers.
type QueueReporter interface {
	Queue() decider.QueueStatus
	PoolSaturation() decider.PoolLoad
}

// ErrResponseGone: the worker that produced Request.ResponseID has left
// the pool, and the stored response with it.
var ErrResponseGone = errors.New("the replica that produced this response is no longer in the pool")

// ErrResponseNotFound: Request.ResponseID belongs to another tenant than
// Request.Tenant; the request must be answered as for an unknown id.
var ErrResponseNotFound = errors.New("the response belongs to another tenant")

// ResponseLearner is implemented by routers that share response affinity:
// LearnResponse tells the others which worker produced a response for
// which tenant, and returns once they can route by it (or it gave up: the
// data plane's own table still has it).
type ResponseLearner interface {
	LearnResponse(ctx context.Context, id, worker, tenant string)
}

// ErrUnavailable marks the "no worker can take this" conditions so the
// proxy maps them to 503 without knowing the engine's error values. It is
// the routing core's ErrNoCapacity, which the in-process decider's errors
// already carry.
var ErrUnavailable = decider.ErrNoCapacity
