package service

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/cartrouter/cart/controlplane/affinity"
	"github.com/cartrouter/cart/controlplane/cpclient"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
)

// The leader pins a Route naming a response a data plane reported to the
// worker that produced it, whatever the prefix says, and answers
// FAILED_PRECONDITION once that worker has left; an unknown response routes
// normally; another tenant's is NOT_FOUND with a ResponseNotFound detail.
func TestLeaderResponsePinning(t *testing.T) {
	cp, rc := leaderWith(t, w1, w2)
	ctx := context.Background()
	h := affinity.HashID("resp_1")
	owner, other := affinity.HashTenant("team-a"), affinity.HashTenant("team-b")
	if _, err := rc.Complete(ctx, connect.NewRequest(&cartv1.CompleteRequest{DataplaneId: "dp1",
		ResponseOrigins: []*cartv1.ResponseOrigin{{IdHash: h, Worker: w2, TenantHash: owner}}})); err != nil {
		t.Fatal(err)
	}
	tenant := owner
	route := func(hash uint64, text string) (*cartv1.RouteResponse, error) {
		resp, err := rc.Route(ctx, connect.NewRequest(&cartv1.RouteRequest{Model: "m", Text: text, DataplaneId: "dp1", ResponseIdHash: hash, TenantHash: tenant}))
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
	tenant = other
	if r, err := route(h, onW1); connect.CodeOf(err) != connect.CodeNotFound || !cpclient.IsResponseNotFound(err) {
		t.Fatalf("another tenant's response: %v, %v; want NOT_FOUND with a ResponseNotFound detail", r, err)
	}
	// On a data plane's stream the refusal carries its detail too.
	st := openStream(t, cp)
	if err := st.Send(&cartv1.StreamRequest{Id: 1, TimeoutMicros: 5e6, Call: &cartv1.StreamRequest_Route{Route: &cartv1.RouteRequest{
		Model: "m", Text: onW1, DataplaneId: "dp1", ResponseIdHash: h, TenantHash: other}}}); err != nil {
		t.Fatal(err)
	}
	if a, err := st.Receive(); err != nil || connect.Code(a.GetError().GetCode()) != connect.CodeNotFound ||
		len(a.GetError().GetDetails()) != 1 || !a.GetError().GetDetails()[0].MessageIs(&cartv1.ResponseNotFound{}) {
		t.Fatalf("another tenant's response on the stream: %v, %v; want NOT_FOUND with a ResponseNotFound detail", a, err)
	}
	tenant = 0 // a data plane that predates tenants
	if r, err := route(h, onW1); err != nil || r.GetWorker() != w2 || !r.GetPinned() {
		t.Fatalf("route without a tenant: %v, %v; want pinned to w2", r, err)
	}
	tenant = owner
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
		ResponseOrigins: []*cartv1.ResponseOrigin{{IdHash: h, Worker: w2, TenantHash: affinity.HashTenant("team-a")}}})); err != nil {
		t.Fatal(err)
	}
	var entry *cartv1.RaftCommand
	testkit.WaitFor(t, 5*time.Second, "the origin is replicated", func() bool {
		for _, c := range old.node.commands() {
			for _, o := range c.GetPlaceBatch().GetResponseOrigins() {
				if o.GetIdHash() == h && o.GetWorker() == w2 && o.GetTenantHash() == affinity.HashTenant("team-a") {
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
		r, err := next.router().Route(ctx, connect.NewRequest(&cartv1.RouteRequest{Model: "m", Text: text(64, 9), DataplaneId: "dp1", ResponseIdHash: h, TenantHash: affinity.HashTenant("team-a")}))
		if err != nil || r.Msg.GetWorker() != w2 || !r.Msg.GetPinned() {
			t.Fatalf("route on the new leader: %v, %v; want pinned to w2", r, err)
		}
	}
	// The owner came with the entry: the new leader refuses another tenant.
	if _, err := next.router().Route(ctx, connect.NewRequest(&cartv1.RouteRequest{Model: "m", Text: text(64, 9), DataplaneId: "dp1", ResponseIdHash: h, TenantHash: affinity.HashTenant("team-b")})); !cpclient.IsResponseNotFound(err) {
		t.Fatalf("another tenant on the new leader: %v, want NOT_FOUND with a ResponseNotFound detail", err)
	}
}

// The origins table crosses a snapshot: what one node stored, a node
// restored from its snapshot pins, with the same expiry.
func TestOriginTableThroughSnapshot(t *testing.T) {
	now := time.Unix(5000, 0)
	clock := func() time.Time { return now }
	src := originTable{affinity.New[uint64](time.Minute, 100), clock}
	src.Learn([]*cartv1.ResponseOrigin{{IdHash: 1, Worker: w1, TenantHash: 11}, {IdHash: 2, Worker: w2, TenantHash: 22}})
	stored := src.Stored()
	if len(stored) != 2 || stored[0].GetIdHash() != 2 || stored[0].GetExpiresUnixNanos() != now.Add(time.Minute).UnixNano() || stored[0].GetTenantHash() != 22 {
		t.Fatalf("stored %v: want 2 first (most recent), expiring in a minute, of tenant 22", stored)
	}
	// Through the snapshot's own encoding, as a restore reads it.
	for i, o := range stored {
		b, err := proto.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		stored[i] = &cartv1.StoredOrigin{}
		if err := proto.Unmarshal(b, stored[i]); err != nil {
			t.Fatal(err)
		}
	}
	dst := originTable{affinity.New[uint64](time.Minute, 100), clock}
	dst.Learn([]*cartv1.ResponseOrigin{{IdHash: 3, Worker: w1}})
	dst.Restore(stored)
	// What the node knew before stays: origins are facts.
	for id, want := range map[uint64]affinity.Origin{1: {Worker: w1, Tenant: 11}, 2: {Worker: w2, Tenant: 22}, 3: {Worker: w1}} {
		if got, ok := dst.t.Lookup(id, 0, now); !ok || got != want {
			t.Errorf("id %d: %+v %v, want %+v", id, got, ok, want)
		}
	}
}
