package service

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cartrouter/cart/controlplane/affinity"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
)

// The leader pins a Route naming a response a data plane reported to the
// worker that produced it, whatever the prefix says, and answers NOT_FOUND
// once that worker has left; an unknown response routes normally.
func TestLeaderResponsePinning(t *testing.T) {
	cp, rc := leaderWith(t, w1, w2)
	ctx := context.Background()
	h := affinity.HashID("resp_1")
	if _, err := rc.Complete(ctx, connect.NewRequest(&cartv1.CompleteRequest{DataplaneId: "dp1",
		ResponseOrigins: []*cartv1.ResponseOrigin{{IdHash: h, Worker: w2}}})); err != nil {
		t.Fatal(err)
	}
	route := func(hash uint64, text string) (*cartv1.RouteResponse, error) {
		resp, err := rc.Route(ctx, connect.NewRequest(&cartv1.RouteRequest{Model: "m", Text: text, DataplaneId: "dp1", ResponseIdHash: hash}))
		if err != nil {
			return nil, err
		}
		_, _ = rc.Complete(ctx, connect.NewRequest(&cartv1.CompleteRequest{DataplaneId: "dp1",
			Completions: []*cartv1.Completion{{Ticket: resp.Msg.GetTicket(), Worker: resp.Msg.GetWorker(), Delivered: true, PromptTokens: -1, CachedTokens: -1}}}))
		return resp.Msg, nil
	}
	// Place a prompt on w1, then name resp_1 with it: the prefix says w1.
	onW1 := text(128, 1)
	placed, err := rc.Route(ctx, connect.NewRequest(&cartv1.RouteRequest{Model: "m", Text: onW1, DataplaneId: "dp1", ExcludeWorkers: []string{w2}}))
	if err != nil || placed.Msg.GetWorker() != w1 {
		t.Fatalf("placement: %v %v", placed, err)
	}
	if r, err := route(0, onW1); err != nil || r.GetWorker() != w1 || r.GetReason() != "cache_hit" {
		t.Fatalf("prefix route: %v, %v; want a cache hit on w1", r, err)
	}
	if r, err := route(affinity.HashID("resp_unknown"), onW1); err != nil || r.GetPinned() || r.GetWorker() != w1 {
		t.Fatalf("unknown response: %v, %v; want routed by prefix to w1", r, err)
	}
	for range 3 {
		r, err := route(h, onW1)
		if err != nil || r.GetWorker() != w2 || !r.GetPinned() {
			t.Fatalf("pinned route = %v, %v; want w2, pinned", r, err)
		}
	}
	cmd := &cartv1.RaftCommand{Body: &cartv1.RaftCommand_RemoveWorker{RemoveWorker: &cartv1.RemoveWorkerCommand{Url: w2}}}
	if _, err := cp.node.Apply(ctx, cmd); err != nil {
		t.Fatal(err)
	}
	if _, err := route(h, onW1); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("response on a removed worker: %v, want NOT_FOUND", err)
	}
}

// A response origin the leader learned is replicated with the placement
// batches: a node that applies the log and becomes leader pins the
// conversation as its predecessor did.
func TestResponseOriginsSurviveLeaderChange(t *testing.T) {
	old := newTestCP(t, cpConfig{id: "n1", leader: true})
	old.addWorkers(t, w1, w2)
	ctx := context.Background()
	h := affinity.HashID("resp_kept")
	if _, err := old.router().Complete(ctx, connect.NewRequest(&cartv1.CompleteRequest{DataplaneId: "dp1",
		ResponseOrigins: []*cartv1.ResponseOrigin{{IdHash: h, Worker: w2}}})); err != nil {
		t.Fatal(err)
	}
	var entry *cartv1.RaftCommand
	testkit.WaitFor(t, 5*time.Second, "the origin is replicated", func() bool {
		for _, c := range old.node.commands() {
			for _, o := range c.GetPlaceBatch().GetResponseOrigins() {
				if o.GetIdHash() == h && o.GetWorker() == w2 {
					entry = c
					return true
				}
			}
		}
		return false
	})

	next := newTestCP(t, cpConfig{id: "n2"})
	next.addWorkers(t, w1, w2)
	if _, err := next.node.Apply(ctx, entry); err != nil {
		t.Fatal(err)
	}
	next.node.setLeader(true, "n2")
	next.core.OnLeadership(true)
	testkit.WaitFor(t, 5*time.Second, "n2 leads", func() bool { return next.st.Members()["n2"] == next.url })
	for range 3 {
		r, err := next.router().Route(ctx, connect.NewRequest(&cartv1.RouteRequest{Model: "m", Text: text(64, 9), DataplaneId: "dp1", ResponseIdHash: h}))
		if err != nil || r.Msg.GetWorker() != w2 || !r.Msg.GetPinned() {
			t.Fatalf("route on the new leader: %v, %v; want pinned to w2", r, err)
		}
	}
}

// The origins table crosses a snapshot: what one node stored, a node
// restored from its snapshot pins, with the same expiry.
func TestOriginTableThroughSnapshot(t *testing.T) {
	now := time.Unix(5000, 0)
	clock := func() time.Time { return now }
	src := originTable{affinity.New[uint64](time.Minute, 100), clock}
	src.Learn([]*cartv1.ResponseOrigin{{IdHash: 1, Worker: w1}, {IdHash: 2, Worker: w2}})
	stored := src.Stored()
	if len(stored) != 2 || stored[0].GetIdHash() != 2 || stored[0].GetExpiresUnixNanos() != now.Add(time.Minute).UnixNano() {
		t.Fatalf("stored %v: want 2 first (most recent), expiring in a minute", stored)
	}
	dst := originTable{affinity.New[uint64](time.Minute, 100), clock}
	dst.Learn([]*cartv1.ResponseOrigin{{IdHash: 3, Worker: w1}})
	dst.Restore(stored)
	// What the node knew before stays: origins are facts.
	for id, want := range map[uint64]string{1: w1, 2: w2, 3: w1} {
		if got, ok := dst.t.Lookup(id, now); !ok || got != want {
			t.Errorf("id %d: %q %v, want %q", id, got, ok, want)
		}
	}
}
