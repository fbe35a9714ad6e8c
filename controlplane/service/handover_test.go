package service

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	dto "github.com/prometheus/client_model/go"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
)

// followersNode is the fake node with raftnode's follower health.
type followersNode struct {
	*fakeNode
	healthy int
}

func (n followersNode) HealthyFollowers() int { return n.healthy }

func (h *handover) count(result string) float64 {
	var m dto.Metric
	if err := h.transfers.WithLabelValues(result).Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

var testHandover = HandoverOptions{Enabled: true, Threshold: 15 * time.Millisecond, Window: 3 * time.Second, MinInterval: time.Minute}

// slowSync is a data plane's Sync saying how it saw target's Route latency.
func slowSync(dp, target string, p90 time.Duration) *cartv1.SyncRequest {
	return &cartv1.SyncRequest{DataplaneId: dp, RouteTarget: target, RouteCalls: 40, RouteP90Micros: uint32(p90.Microseconds())}
}

func TestHandoverDecision(t *testing.T) {
	cp := newTestCP(t, cpConfig{id: "n1", opts: func(o *Options) { o.SlowLeader = testHandover }})
	node := followersNode{cp.node, 2}
	cp.core.node = node // no leader loops run: the test drives tick
	h := cp.core.handover
	me := cp.url
	ctx := context.Background()
	t0 := time.Unix(1_800_000_000, 0)
	leaderSince := t0.Add(-time.Hour)
	report := func(at time.Time, slow ...bool) {
		for i, s := range slow {
			p90 := 2 * time.Millisecond
			if s {
				p90 = 200 * time.Millisecond
			}
			h.report(slowSync(string(rune('a'+i)), me, p90), at)
		}
	}
	lead := func() { node.setLeader(true, "n1") }
	lead()

	// Two of three data planes see it slow: a handover once that has
	// lasted a whole window, not before.
	report(t0, true, true, false)
	if h.tick(ctx, t0, leaderSince) {
		t.Fatal("handed over at the first slow report")
	}
	report(t0.Add(2*time.Second), true, true, false)
	if h.tick(ctx, t0.Add(2999*time.Millisecond), leaderSince) {
		t.Fatal("handed over before the window passed")
	}
	if !h.tick(ctx, t0.Add(3*time.Second), leaderSince) || node.IsLeader() || h.count("ok") != 1 {
		t.Fatalf("no handover after a sustained slow window (leader %v, ok %v)", node.IsLeader(), h.count("ok"))
	}

	// Damping: the same node does not hand over again within the interval.
	lead()
	t1 := t0.Add(3 * time.Second)
	for at := t1; at.Before(t1.Add(time.Minute)); at = at.Add(time.Second) {
		report(at, true, true, true)
		if h.tick(ctx, at, leaderSince) {
			t.Fatalf("handed over again %v after the last one", at.Sub(t1))
		}
	}
	report(t1.Add(time.Minute), true, true, true)
	if !h.tick(ctx, t1.Add(time.Minute), leaderSince) {
		t.Fatal("no handover once the interval passed")
	}

	// A leader elected less than an interval ago keeps leading.
	fresh := newTestCP(t, cpConfig{id: "n1", opts: func(o *Options) { o.SlowLeader = testHandover }})
	fnode := followersNode{fresh.node, 2}
	fresh.core.node = fnode
	fnode.setLeader(true, "n1")
	fh := fresh.core.handover
	for at := t0; at.Before(t0.Add(time.Minute)); at = at.Add(time.Second) {
		fh.report(slowSync("a", fresh.url, time.Second), at)
		if fh.tick(ctx, at, t0) {
			t.Fatalf("a new leader handed over %v into its term", at.Sub(t0))
		}
	}

	// Not when only a minority sees it slow, when the reports are about
	// another node, or when no follower is healthy.
	cases := map[string]struct {
		reports func(at time.Time)
		healthy int
	}{
		"minority": {func(at time.Time) { report(at, true, false, false) }, 2},
		"other target": {func(at time.Time) {
			for _, dp := range []string{"a", "b", "c"} {
				h.report(slowSync(dp, "http://n2.test", time.Second), at)
			}
		}, 2},
		"no calls": {func(at time.Time) {
			h.report(&cartv1.SyncRequest{DataplaneId: "a", RouteTarget: me}, at)
		}, 2},
		"no healthy follower": {func(at time.Time) { report(at, true, true, true) }, 0},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			h := newHandover(newTestCP(t, cpConfig{id: "n1"}).core, testHandover)
			h.c.o.APIURL = me
			n := followersNode{cp.node, tc.healthy}
			h.c.node = n
			n.setLeader(true, "n1")
			for at := t0; at.Before(t0.Add(10 * time.Second)); at = at.Add(500 * time.Millisecond) {
				tc.reports(at)
				if h.tick(ctx, at, leaderSince) {
					t.Fatalf("handed over at %v", at.Sub(t0))
				}
			}
		})
	}

	// A breaker held open counts as slow even without calls in the window.
	b := newHandover(newTestCP(t, cpConfig{id: "n1"}).core, testHandover)
	b.c.o.APIURL = me
	bn := followersNode{cp.node, 1}
	b.c.node = bn
	bn.setLeader(true, "n1")
	open := &cartv1.SyncRequest{DataplaneId: "a", RouteTarget: me, RouteBreakerOpen: true}
	b.report(open, t0)
	b.tick(ctx, t0, leaderSince)
	b.report(open, t0.Add(2*time.Second))
	if !b.tick(ctx, t0.Add(3*time.Second), leaderSince) {
		t.Fatal("an open breaker did not count as slow")
	}
}

// Three real Raft nodes: data planes report the leader slow in their
// syncs. With the handover on, leadership moves to another node; a
// cluster with it off, fed the same reports, keeps its leader.
func TestSlowLeaderHandsOverLeadership(t *testing.T) {
	url := func(o *Options) { o.APIURL = "http://" + o.NodeID + ".test:6701" }
	on := newRaftCluster(t, 3, url, func(o *Options) {
		o.SlowLeader = HandoverOptions{Enabled: true, Threshold: 15 * time.Millisecond, Window: time.Second, MinInterval: time.Second}
	})
	off := newRaftCluster(t, 3, url)
	onLeader, offLeader := on.leader(), off.leader()
	feed := func(x *raftCP) {
		for _, dp := range []string{"dp1", "dp2"} {
			// The reports reach whichever node leads now, as they would
			// through a follower's forwarding; only those naming the node
			// they measured count.
			_, _ = x.core.Router().Sync(context.Background(), connect.NewRequest(slowSync(dp, x.core.o.APIURL, 200*time.Millisecond)))
		}
	}
	testkit.WaitFor(t, 20*time.Second, "the slow leader hands over", func() bool {
		feed(onLeader)
		feed(offLeader)
		return onLeader.core.handover.count("ok") == 1
	})
	next := on.leader()
	if next == onLeader {
		t.Fatal("the old leader leads again")
	}
	if got := onLeader.core.handover.count("failed"); got != 0 {
		t.Fatalf("failed handovers = %v", got)
	}
	if l := off.leader(); l != offLeader || off.nodes[0].core.handover != nil {
		t.Fatalf("with the handover off, leadership moved from %s to %s", offLeader.id, l.id)
	}
}
