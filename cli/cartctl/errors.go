package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/cartrouter/cart/controlplane/cpclient"
)

// Exit codes. They are documented in the root command's help and are an
// interface: scripts branch on them, so never renumber.
const (
	exitOK          = 0
	exitError       = 1
	exitUsage       = 2
	exitNotFound    = 3
	exitExists      = 4
	exitNotLeader   = 5
	exitAuth        = 6
	exitUnavailable = 7
	// exitUnknown: the server cannot tell whether a write took effect (it
	// was appended, then leadership was lost). Never "not done": the write
	// may still commit. Commands are idempotent, so repeating the same
	// command until it answers 0 (or a definite error) settles it.
	exitUnknown = 8
)

// usageError marks a problem with how cartctl was invoked (flags,
// arguments, settings), as opposed to a failure of the call itself.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Errorf(format, args...)}
}

// exitCode maps an error to the documented exit code.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	if _, ok := errors.AsType[*usageError](err); ok {
		return exitUsage
	}
	if unknownOutcome(err) {
		return exitUnknown
	}
	if ce, ok := errors.AsType[*connect.Error](err); ok {
		switch ce.Code() {
		case connect.CodeInvalidArgument:
			return exitUsage
		case connect.CodeNotFound:
			return exitNotFound
		case connect.CodeAlreadyExists:
			return exitExists
		case connect.CodeFailedPrecondition:
			// The control plane uses FailedPrecondition only for "this
			// node is not the leader".
			return exitNotLeader
		case connect.CodeUnauthenticated, connect.CodePermissionDenied:
			return exitAuth
		case connect.CodeUnavailable:
			if noLeader(ce) {
				return exitNotLeader
			}
			return exitUnavailable
		case connect.CodeDeadlineExceeded:
			return exitUnavailable
		}
		return exitError
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return exitUnavailable
	}
	if _, ok := errors.AsType[net.Error](err); ok {
		return exitUnavailable
	}
	return exitError
}

// unknownOutcome reports whether a server answered that a write's outcome
// is unknown: code Aborted, which the control plane uses for nothing else.
// Any attempt counts, not only the last: a write that may have landed on
// one server stays "maybe" whatever another server said after it.
func unknownOutcome(err error) bool {
	if re, ok := errors.AsType[*rpcError](err); ok {
		for _, at := range re.attempts {
			if unknownOutcome(at.err) {
				return true
			}
		}
		return false
	}
	ce, ok := errors.AsType[*connect.Error](err)
	return ok && connect.IsWireError(ce) && (ce.Code() == connect.CodeAborted || ce.Meta().Get(cpclient.HeaderWriteOutcome) == cpclient.OutcomeUnknown)
}

// noLeader reports whether a server answered that it cannot reach the
// leader (the cluster has none, or this node cannot tell where it is): an
// Unavailable with the NotLeader detail. A client-side Unavailable
// (connection refused) is never it.
func noLeader(ce *connect.Error) bool {
	_, ok := cpclient.NotLeaderOf(ce)
	return ok
}

// failover reports whether the next server should be tried after err:
// only when this one could not be reached or could not serve. Any other
// answer (NotFound, AlreadyExists, ...) is the cluster's answer, and asking
// another member would only repeat it.
func failover(err error) bool {
	return connect.CodeOf(err) == connect.CodeUnavailable
}

// attempt is one server tried for one call.
type attempt struct {
	server string
	err    error
}

// rpcError is a failed call, after every server worth trying. It unwraps
// to the last server's error, which decides the exit code.
type rpcError struct {
	attempts []attempt
	timeout  time.Duration
}

func (e *rpcError) Unwrap() error { return e.attempts[len(e.attempts)-1].err }

func (e *rpcError) Error() string {
	last := e.attempts[len(e.attempts)-1]
	if len(e.attempts) == 1 || !failover(last.err) {
		return describe(last, e.timeout)
	}
	parts := make([]string, len(e.attempts))
	for i, at := range e.attempts {
		parts[i] = describe(at, e.timeout)
	}
	return fmt.Sprintf("no control-plane server could answer (%d tried): %s", len(e.attempts), strings.Join(parts, "; "))
}

// describe renders one failed attempt as a one-line message for people:
// the server's own words where they are clear, plus what to do next.
func describe(at attempt, timeout time.Duration) string {
	ce, ok := errors.AsType[*connect.Error](at.err)
	if !ok {
		return fmt.Sprintf("%s: %v", at.server, at.err)
	}
	msg := ce.Message()
	switch ce.Code() {
	case connect.CodeNotFound, connect.CodeAlreadyExists:
		return msg
	case connect.CodeFailedPrecondition:
		nl, _ := cpclient.NotLeaderOf(ce)
		leader := nl.GetLeaderUrl()
		if leader == "" {
			return fmt.Sprintf("%s: %s", at.server, msg)
		}
		who := "the leader is at " + leader
		if id := nl.GetLeaderId(); id != "" {
			who = fmt.Sprintf("the leader is %s at %s", id, leader)
		}
		return fmt.Sprintf("not the leader; %s (retry with --server %s)", who, leader)
	case connect.CodeUnauthenticated:
		return fmt.Sprintf("%s rejected the credentials: %s (set --token, --token-file or CARTCTL_TOKEN)", at.server, msg)
	case connect.CodePermissionDenied:
		return fmt.Sprintf("%s: permission denied: %s", at.server, msg)
	case connect.CodeUnavailable:
		if !connect.IsWireError(ce) {
			return fmt.Sprintf("cannot reach the control plane at %s: %s", at.server, msg)
		}
		return fmt.Sprintf("%s is unavailable: %s", at.server, msg)
	case connect.CodeDeadlineExceeded:
		return fmt.Sprintf("timed out after %s waiting for %s (raise --timeout?)", timeout, at.server)
	case connect.CodeAborted:
		if connect.IsWireError(ce) {
			return fmt.Sprintf("%s: %s (the write may or may not have been applied; repeating it is safe)", at.server, msg)
		}
	}
	return fmt.Sprintf("%s: %s: %s", at.server, ce.Code(), msg)
}
