package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cartrouter/cart/controlplane/cpclient"
)

func wireErr(code connect.Code, msg string) *connect.Error {
	return connect.NewWireError(code, errors.New(msg))
}

func TestExitCode(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"nil", nil, exitOK},
		{"plain error", errors.New("boom"), exitError},
		{"usage", usagef("bad flag"), exitUsage},
		{"wrapped usage", fmt.Errorf("context: %w", usagef("bad flag")), exitUsage},
		{"invalid argument", wireErr(connect.CodeInvalidArgument, "worker url: bad"), exitUsage},
		{"not found", wireErr(connect.CodeNotFound, "worker x not found"), exitNotFound},
		{"already exists", wireErr(connect.CodeAlreadyExists, "worker x already exists"), exitExists},
		{"not leader", wireErr(connect.CodeFailedPrecondition, "not the leader"), exitNotLeader},
		{"no leader", withNotLeader(wireErr(connect.CodeUnavailable, "no leader: this node cannot reach a quorum"), "", ""), exitNotLeader},
		{"forwarded to non-leader", withNotLeader(wireErr(connect.CodeUnavailable, "node n2 is not the leader either: no leader: ..."), "n3", "http://n3"), exitNotLeader},
		{"leader url unpublished", withNotLeader(wireErr(connect.CodeUnavailable, "leader n3 has not published its API URL yet"), "n3", ""), exitNotLeader},
		// The detail decides, not the words.
		{"unavailable saying no leader", wireErr(connect.CodeUnavailable, "no leader here"), exitUnavailable},
		{"unauthenticated", wireErr(connect.CodeUnauthenticated, "missing or invalid bearer token"), exitAuth},
		{"permission denied", wireErr(connect.CodePermissionDenied, "loopback only"), exitAuth},
		{"server unavailable", wireErr(connect.CodeUnavailable, "commit: timeout"), exitUnavailable},
		// A client-side error never means "no leader", whatever it says.
		{"connection refused", connect.NewError(connect.CodeUnavailable, errors.New("dial tcp: no leader here")), exitUnavailable},
		{"deadline", connect.NewError(connect.CodeDeadlineExceeded, context.DeadlineExceeded), exitUnavailable},
		{"bare deadline", fmt.Errorf("read: %w", context.DeadlineExceeded), exitUnavailable},
		{"net error", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, exitUnavailable},
		{"resource exhausted", wireErr(connect.CodeResourceExhausted, "every usable worker is at max_load"), exitError},
		{"internal", wireErr(connect.CodeInternal, "oops"), exitError},
		{"canceled", connect.NewError(connect.CodeCanceled, context.Canceled), exitError},
		{"outcome unknown", wireErr(connect.CodeAborted, "write outcome unknown, retry the same command"), exitUnknown},
		{"outcome unknown by header", func() error {
			e := wireErr(connect.CodeUnavailable, "x")
			e.Meta().Set(cpclient.HeaderWriteOutcome, "unknown")
			return e
		}(), exitUnknown},
		// cartctl itself never makes up an unknown outcome.
		{"local aborted", connect.NewError(connect.CodeAborted, errors.New("x")), exitError},
		// A write that may have landed stays "maybe" after a failover,
		// whatever the next server said.
		{"unknown then no leader", &rpcError{attempts: []attempt{
			{"http://a", wireErr(connect.CodeAborted, "write outcome unknown")},
			{"http://b", withNotLeader(wireErr(connect.CodeUnavailable, "no leader: x"), "", "")},
		}}, exitUnknown},
		{"rpc error", &rpcError{attempts: []attempt{{"http://a", wireErr(connect.CodeNotFound, "gone")}}}, exitNotFound},
		{"rpc error uses last attempt", &rpcError{attempts: []attempt{
			{"http://a", connect.NewError(connect.CodeUnavailable, errors.New("refused"))},
			{"http://b", wireErr(connect.CodeAlreadyExists, "exists")},
		}}, exitExists},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := exitCode(tt.err); got != tt.want {
				t.Errorf("exitCode(%v) = %d, want %d", tt.err, got, tt.want)
			}
		})
	}
}

func TestDescribe(t *testing.T) {
	notLeader := withNotLeader(wireErr(connect.CodeFailedPrecondition, "not the leader (node is not the leader)"), "n2", "http://10.0.0.2:6701")
	notLeaderNoID := withNotLeader(wireErr(connect.CodeFailedPrecondition, "not the leader"), "", "http://10.0.0.2:6701")
	refused := connect.NewError(connect.CodeUnavailable, errors.New("dial tcp 127.0.0.1:1: connect: connection refused"))

	tests := []struct {
		name string
		err  error
		want string
	}{
		{"not found", &rpcError{attempts: []attempt{{"http://a", wireErr(connect.CodeNotFound, "worker http://w not found")}}},
			"worker http://w not found"},
		{"not leader with id", &rpcError{attempts: []attempt{{"http://a", notLeader}}},
			"not the leader; the leader is n2 at http://10.0.0.2:6701 (retry with --server http://10.0.0.2:6701)"},
		{"not leader without id", &rpcError{attempts: []attempt{{"http://a", notLeaderNoID}}},
			"not the leader; the leader is at http://10.0.0.2:6701 (retry with --server http://10.0.0.2:6701)"},
		{"unauthenticated", &rpcError{attempts: []attempt{{"http://a", wireErr(connect.CodeUnauthenticated, "missing or invalid bearer token")}}},
			"http://a rejected the credentials: missing or invalid bearer token (set --token, --token-file or CARTCTL_TOKEN)"},
		{"refused", &rpcError{attempts: []attempt{{"http://a", refused}}},
			"cannot reach the control plane at http://a: dial tcp 127.0.0.1:1: connect: connection refused"},
		{"no leader", &rpcError{attempts: []attempt{{"http://a", wireErr(connect.CodeUnavailable, "no leader: minority")}}},
			"http://a is unavailable: no leader: minority"},
		{"timeout", &rpcError{timeout: 3 * time.Second, attempts: []attempt{{"http://a", connect.NewError(connect.CodeDeadlineExceeded, context.DeadlineExceeded)}}},
			"timed out after 3s waiting for http://a (raise --timeout?)"},
		{"all failed", &rpcError{attempts: []attempt{{"http://a", refused}, {"http://b", wireErr(connect.CodeUnavailable, "no leader: x")}}},
			"no control-plane server could answer (2 tried): cannot reach the control plane at http://a: dial tcp 127.0.0.1:1: connect: connection refused; http://b is unavailable: no leader: x"},
		{"failover then answer", &rpcError{attempts: []attempt{{"http://a", refused}, {"http://b", wireErr(connect.CodeAlreadyExists, "worker exists")}}},
			"worker exists"},
		{"other code", &rpcError{attempts: []attempt{{"http://a", wireErr(connect.CodeInvalidArgument, "worker url: bad")}}},
			"http://a: invalid_argument: worker url: bad"},
		{"local not found", connect.NewError(connect.CodeNotFound, errors.New("worker http://w not found")),
			"worker http://w not found"},
		{"outcome unknown", &rpcError{attempts: []attempt{{"http://a", wireErr(connect.CodeAborted, "write outcome unknown, retry the same command (it is idempotent): commit: leadership lost")}}},
			"http://a: write outcome unknown, retry the same command (it is idempotent): commit: leadership lost (the write may or may not have been applied; repeating it is safe)"},
		{"plain", errors.New("boom"), "boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := message(tt.err); got != tt.want {
				t.Errorf("message:\n got %q\nwant %q", got, tt.want)
			}
		})
	}
}
