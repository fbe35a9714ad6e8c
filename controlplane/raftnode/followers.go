package raftnode

import (
	"sync"

	"github.com/hashicorp/raft"
)

// followerHealth remembers which peers the leader's heartbeats currently
// fail to reach, from raft's heartbeat observations (raft exposes no
// per-follower contact time otherwise). Every change of leader starts it
// over: heartbeats are the leader's, and a new term's replication starts
// from scratch.
type followerHealth struct {
	mu      sync.Mutex
	failing map[raft.ServerID]bool
}

// observe records a heartbeat observation and reports whether it was one;
// a leader observation clears the record but is not consumed.
func (f *followerHealth) observe(data any) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch o := data.(type) {
	case raft.FailedHeartbeatObservation:
		if f.failing == nil {
			f.failing = map[raft.ServerID]bool{}
		}
		f.failing[o.PeerID] = true
		return true
	case raft.ResumedHeartbeatObservation:
		delete(f.failing, o.PeerID)
		return true
	case raft.LeaderObservation:
		clear(f.failing)
	}
	return false
}

func (f *followerHealth) isFailing(id raft.ServerID) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failing[id]
}

// HealthyFollowers returns how many voters other than this node answer the
// leader's heartbeats (0 when this node does not lead). A leader hands
// over only when this is at least one: raft's own transfer then still
// brings the chosen follower's log up to date first, or fails.
func (n *Node) HealthyFollowers() int {
	if n.raft.State() != raft.Leader {
		return 0
	}
	servers, err := n.servers()
	if err != nil {
		return 0
	}
	healthy := 0
	for _, s := range servers {
		if s.Suffrage == raft.Voter && string(s.ID) != n.cfg.NodeID && !n.followers.isFailing(s.ID) {
			healthy++
		}
	}
	return healthy
}
