package cpclient

import (
	"errors"
	"fmt"
	"testing"

	"connectrpc.com/connect"

	"github.com/cartrouter/cart/controlplane/engine"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

func TestNotLeaderOf(t *testing.T) {
	detailed := func(ce *connect.Error, nl *cartv1.NotLeader) *connect.Error {
		d, err := connect.NewErrorDetail(nl)
		if err != nil {
			t.Fatal(err)
		}
		ce.AddDetail(d)
		return ce
	}
	cause := errors.New("not the leader")
	tests := []struct {
		name   string
		err    error
		want   bool
		leader string
	}{
		{"server's answer naming the leader", detailed(connect.NewWireError(connect.CodeFailedPrecondition, cause), &cartv1.NotLeader{LeaderUrl: "http://l:1"}), true, "http://l:1"},
		{"wrapped server's answer", fmt.Errorf("route: %w", detailed(connect.NewWireError(connect.CodeUnavailable, cause), &cartv1.NotLeader{})), true, ""},
		{"server's answer without the detail", connect.NewWireError(connect.CodeUnavailable, cause), false, ""},
		{"client-side error with the detail", detailed(connect.NewError(connect.CodeFailedPrecondition, cause), &cartv1.NotLeader{LeaderUrl: "http://l:1"}), false, ""},
		{"not a connect error", cause, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nl, ok := NotLeaderOf(tt.err)
			if ok != tt.want || nl.GetLeaderUrl() != tt.leader {
				t.Fatalf("NotLeaderOf = %v, %v; want ok %v, leader %q", nl, ok, tt.want, tt.leader)
			}
		})
	}
}

// A saturated pool is told apart from an empty one by the detail, and by
// the message of leaders that predate it; other refusals are neither.
func TestIsPoolSaturated(t *testing.T) {
	detailed := connect.NewError(connect.CodeResourceExhausted, errors.New("no worker available"))
	d, err := connect.NewErrorDetail(&cartv1.PoolSaturated{})
	if err != nil {
		t.Fatal(err)
	}
	detailed.AddDetail(d)
	// As leaders before the detail sent it, whatever the engine says now.
	legacy := connect.NewError(connect.CodeResourceExhausted, errors.New("no worker available: every usable worker is saturated (at max_load or its concurrency)"))
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"detail", detailed, true},
		{"detail, wrapped", fmt.Errorf("route: %w", detailed), true},
		{"older leader's message", legacy, true},
		{"no healthy worker", connect.NewError(connect.CodeResourceExhausted, engine.ErrNoHealthy), false},
		{"the message under another code", connect.NewError(connect.CodeUnavailable, engine.ErrAllSaturated), false},
		{"not a Connect error", engine.ErrAllSaturated, false},
	} {
		if got := IsPoolSaturated(c.err); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
