package raftnode

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/cartrouter/cart/controlplane/engine"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// Commands applied on the leader reach every node, and the replicas end in
// the same state: worker set, member directory and prefix index.
func TestClusterReplicatesAndConverges(t *testing.T) {
	c := newCluster(t, 3, clusterOpts{})
	r := rand.New(rand.NewPCG(7, 7))
	workers := []string{"http://w1:8000", "http://w2:8000", "http://w3:8000"}
	for _, w := range workers {
		c.apply(upsertCmd(w, 8))
	}
	for _, tn := range c.nodes {
		c.apply(memberCmd(tn.id, "http://"+tn.id+":9000"))
	}
	var first *cartv1.Placement
	for i := range 40 {
		var ps []*cartv1.Placement
		for j := range 5 {
			ps = append(ps, placement(workers[r.IntN(len(workers))], newPrompt(r, 1+r.IntN(8)), int64(i*10+j)))
		}
		if first == nil {
			first = ps[0]
		}
		c.apply(placeCmd(ps...))
	}
	c.apply(unplaceCmd(first))
	if res, _ := c.apply(removeCmd(workers[2])); res.Err != nil {
		t.Fatalf("remove %s: %v", workers[2], res.Err)
	}
	// A well-formed but impossible command is rejected in the result, the
	// same way on every node, without stopping anything.
	if res, _ := c.apply(removeCmd("http://nope:1")); res.Err == nil {
		t.Fatal("removing an unknown worker: want a rejection in the result")
	}

	d := c.converge(5 * time.Second)
	if d.workers != "http://w1:8000/8/0/1048576,http://w2:8000/8/0/1048576" {
		t.Errorf("workers = %s", d.workers)
	}
	if len(d.members) != 3 || d.members["n2"] != "http://n2:9000" {
		t.Errorf("members = %v", d.members)
	}
	if len(d.entries) < 50 {
		t.Errorf("only %d index entries replicated", len(d.entries))
	}
	for h, e := range d.entries {
		if strings.Contains(e, workers[2]) {
			t.Fatalf("entry %x still held by removed worker: %s", h, e)
		}
	}
	if e, ok := d.entries[first.BlockHashes[len(first.BlockHashes)-1]]; ok && strings.Contains(e, first.Worker+"@") {
		t.Errorf("withdrawn placement still recorded: %s", e)
	}

	// Role checks race with leadership changes on a loaded machine: a
	// failure counts only if the leader kept its term throughout.
	for attempt := 1; ; attempt++ {
		ld := c.leader()
		term := ld.node.Raft().CurrentTerm()
		problems := checkRoles(c, ld)
		if len(problems) == 0 {
			break
		}
		if (ld.node.IsLeader() && ld.node.Raft().CurrentTerm() == term) || attempt == 3 {
			t.Fatalf("leader %s, term %d:\n%s", ld.id, term, strings.Join(problems, "\n"))
		}
	}
}

// checkRoles exercises the leader-only API from a follower and the
// leader and checks what each reports.
func checkRoles(c *cluster, ld *testNode) []string {
	var problems []string
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	var follower *testNode
	for _, tn := range c.nodes {
		if tn != ld && tn.node.Raft().State() == raft.Follower {
			follower = tn
		}
	}
	if follower == nil {
		return []string{"no follower"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := follower.node.Apply(ctx, upsertCmd("http://w9:8000", 1))
	if !errors.Is(err, ErrNotLeader) || !strings.Contains(err.Error(), ld.id) {
		fail("apply on a follower: got %v, want ErrNotLeader naming %s", err, ld.id)
	}
	if err := follower.node.AddVoter(ctx, "n9", "x"); !errors.Is(err, ErrNotLeader) {
		fail("add voter on a follower: got %v, want ErrNotLeader", err)
	}
	if _, err := follower.node.TransferLeadership(ctx, ""); !errors.Is(err, ErrNotLeader) {
		fail("transfer leadership on a follower: got %v, want ErrNotLeader", err)
	}
	// Joining again with the same address is a no-op success.
	if err := ld.node.AddVoter(ctx, follower.id, string(follower.addr)); err != nil {
		fail("idempotent add voter: %v", err)
	}
	// Removing a server that is not a member is a no-op success.
	if err := ld.node.RemoveServer(ctx, "n9"); err != nil {
		fail("idempotent remove server: %v", err)
	}

	st := ld.node.Status()
	if st.State != "leader" || st.LeaderID != ld.id || st.LeaderAddr != string(ld.addr) || st.Term == 0 || st.AppliedIndex == 0 || st.CommitIndex < st.AppliedIndex || st.LastLogIndex < st.CommitIndex {
		fail("leader status = %+v", st)
	}
	if len(st.Members) != 3 {
		fail("members = %+v", st.Members)
	}
	for _, m := range st.Members {
		if m.Suffrage != "voter" {
			fail("member %+v: want voter", m)
		}
	}
	if fs := follower.node.Status(); fs.State != "follower" || fs.LeaderID != ld.id {
		fail("follower status = %+v", fs)
	}
	// Leadership may have moved before; what must hold is that gains and
	// losses alternate and each node's last call matches its role.
	if ev := ld.lead.all(); !alternating(ev) || len(ev) == 0 || !ev[len(ev)-1] {
		fail("leader's onLeadership calls = %v, want alternating, ending with true", ev)
	}
	if ev := follower.lead.all(); !alternating(ev) || (len(ev) > 0 && ev[len(ev)-1]) {
		fail("follower's onLeadership calls = %v, want alternating, ending with false", ev)
	}
	return problems
}

// A partitioned leader cannot acknowledge writes; the majority side elects
// a leader that already holds every placement replicated before the cut;
// after healing, the old leader drops its uncommitted entry and converges.
func TestLeaderPartition(t *testing.T) {
	c := newCluster(t, 3, clusterOpts{})
	r := rand.New(rand.NewPCG(3, 4))
	workers := []string{"http://w1:8000", "http://w2:8000", "http://w3:8000"}
	for _, w := range workers {
		c.apply(upsertCmd(w, 0))
	}
	type placed struct {
		p      prompt
		worker string
	}
	var all []placed
	for i := range 10 {
		var ps []*cartv1.Placement
		for range 3 {
			pl := placed{newPrompt(r, 4+r.IntN(8)), workers[r.IntN(len(workers))]}
			all = append(all, pl)
			ps = append(ps, placement(pl.worker, pl.p, int64(i)))
		}
		c.apply(placeCmd(ps...))
	}

	old := c.leader()
	c.isolate(old)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := old.node.Apply(ctx, upsertCmd("http://minority:1", 0)); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("write on the isolated leader: got %v, want ErrNotLeader", err)
	}
	t.Logf("isolated leader refused the write after %v", time.Since(start))

	var others []*testNode
	for _, tn := range c.nodes {
		if tn != old {
			others = append(others, tn)
		}
	}
	nl := c.leader(others...)
	if old.node.IsLeader() {
		t.Fatal("isolated node still claims ready leadership")
	}
	for i, pl := range all {
		d, err := nl.route(pl.p)
		if err != nil {
			t.Fatalf("route prompt %d on new leader: %v", i, err)
		}
		if d.Reason != engine.ReasonCacheHit || d.Worker != pl.worker {
			t.Errorf("prompt %d on new leader: %s, want cache_hit -> %s", i, d, pl.worker)
		}
	}
	c.apply(upsertCmd("http://after-partition:1", 0), others...)
	if _, err := old.node.Apply(ctx, upsertCmd("http://minority:2", 0)); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("second write on the isolated node: got %v, want ErrNotLeader", err)
	}

	c.heal()
	d := c.converge(10 * time.Second)
	if !strings.Contains(d.workers, "http://after-partition:1") {
		t.Errorf("majority write lost after heal: %s", d.workers)
	}
	if strings.Contains(d.workers, "minority") {
		t.Errorf("unacknowledged minority write survived: %s", d.workers)
	}
}

// A follower that missed more entries than the leader keeps after a
// snapshot catches up by installing the snapshot.
func TestLaggingFollowerInstallsSnapshot(t *testing.T) {
	const trailing = 16
	c := newCluster(t, 3, clusterOpts{snapshotThreshold: 64, trailingLogs: trailing})
	c.apply(upsertCmd("http://w1:8000", 0))
	c.apply(upsertCmd("http://w2:8000", 0))
	c.converge(5 * time.Second)

	ld := c.leader()
	var lag *testNode
	var rest []*testNode
	for _, tn := range c.nodes {
		if tn != ld && lag == nil {
			lag = tn
		} else {
			rest = append(rest, tn)
		}
	}
	c.isolate(lag)
	r := rand.New(rand.NewPCG(5, 6))
	for i := range 300 {
		if i%50 == 0 {
			c.apply(upsertCmd("http://extra-"+strconv.Itoa(i)+":8000", 0), rest...)
			continue
		}
		c.apply(placeCmd(placement("http://w"+strconv.Itoa(1+i%2)+":8000", newPrompt(r, 3), int64(i))), rest...)
	}
	lagLast := lag.node.Raft().LastIndex()
	// Either connected node may lead when the partition heals; after
	// compaction each keeps only `trailing` entries before its snapshot,
	// so neither can send the lagging node the entries it lacks.
	for _, tn := range rest {
		if err := tn.node.Raft().Snapshot().Error(); err != nil {
			t.Fatalf("snapshot on %s: %v", tn.id, err)
		}
		snapIdx, err := strconv.ParseUint(tn.node.Raft().Stats()["last_snapshot_index"], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if lagLast+trailing >= snapIdx {
			t.Fatalf("lagging node at %d, %s's snapshot at %d: the log still covers the gap", lagLast, tn.id, snapIdx)
		}
	}
	if n := lag.node.restores(); n != 0 {
		t.Fatalf("restores before reconnect = %d", n)
	}

	c.heal()
	d := c.converge(10 * time.Second)
	if n := lag.node.restores(); n == 0 {
		t.Error("lagging node converged without installing a snapshot")
	}
	if s := lag.node.Raft().Stats()["last_snapshot_index"]; s == "0" {
		t.Errorf("lagging node's last_snapshot_index = %s", s)
	}
	if !strings.Contains(d.workers, "http://extra-250:8000") || len(d.entries) < 290*3 {
		t.Errorf("converged state incomplete: %s", d)
	}
}

// A leader that shuts down hands leadership over: a successor is ready far
// sooner than followers would notice the silence and hold an election.
func TestShutdownTransfersLeadership(t *testing.T) {
	c := newCluster(t, 3, clusterOpts{})
	c.apply(upsertCmd("http://w1:8000", 0))
	c.converge(5 * time.Second)

	// Slow failure detection down to 1 s (its random timer is 1-2 s), so
	// a successor within a fraction of that can only come from a transfer.
	const slow = time.Second
	for _, tn := range c.nodes {
		rc := tn.node.Raft().ReloadableConfig()
		rc.HeartbeatTimeout, rc.ElectionTimeout = slow, slow
		if err := tn.node.Raft().ReloadConfig(rc); err != nil {
			t.Fatalf("reload config on %s: %v", tn.id, err)
		}
	}
	time.Sleep(250 * time.Millisecond) // timers armed with the old values expire

	ld := c.leader()
	var others []*testNode
	for _, tn := range c.nodes {
		if tn != ld {
			others = append(others, tn)
		}
	}
	start := time.Now()
	if err := ld.node.Shutdown(); err != nil {
		t.Fatalf("shutdown leader: %v", err)
	}
	nl := c.leader(others...)
	took := time.Since(start)
	t.Logf("new leader %s ready %v after shutdown began", nl.id, took)
	if took > slow/2 {
		t.Errorf("successor took %v; a transfer should beat the %v failure detection by far", took, slow)
	}
	if ev := ld.lead.all(); !alternating(ev) || len(ev) == 0 || ev[len(ev)-1] {
		t.Errorf("old leader's onLeadership calls = %v, want alternating, ending with false", ev)
	}
	if ev := nl.lead.all(); !alternating(ev) || len(ev) == 0 || !ev[len(ev)-1] {
		t.Errorf("new leader's onLeadership calls = %v, want alternating, ending with true", ev)
	}
	c.apply(upsertCmd("http://w2:8000", 0), others...)
	if err := ld.node.Shutdown(); err != nil {
		t.Errorf("second shutdown: %v", err)
	}
	if st := ld.node.Status(); st.State != "shutdown" {
		t.Errorf("status after shutdown: %+v", st)
	}
}
