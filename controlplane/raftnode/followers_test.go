package raftnode

import (
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
)

// The leader counts the followers its heartbeats reach: a follower cut off
// stops counting, and counts again once heartbeats resume.
func TestHealthyFollowers(t *testing.T) {
	c := newCluster(t, 3, clusterOpts{})
	ld := c.leader()
	testkit.WaitFor(t, 5*time.Second, "both followers healthy", func() bool { return ld.node.HealthyFollowers() == 2 })
	var follower *testNode
	for _, tn := range c.nodes {
		if tn != ld {
			follower = tn
			if got := tn.node.HealthyFollowers(); got != 0 {
				t.Fatalf("follower %s counts %d healthy followers, want 0", tn.id, got)
			}
		}
	}
	// Cut only the leader's link to one follower, so that follower does
	// not start an election the other would have to answer.
	ld.trans.Disconnect(follower.addr)
	testkit.WaitFor(t, 5*time.Second, "the cut-off follower stops counting", func() bool { return ld.node.HealthyFollowers() == 1 })
	ld.trans.Connect(follower.addr, follower.trans)
	testkit.WaitFor(t, 10*time.Second, "the follower counts again", func() bool {
		l := c.leader()
		return l.node.HealthyFollowers() == 2
	})
}
