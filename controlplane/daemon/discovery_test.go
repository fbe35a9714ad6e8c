package daemon_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cartrouter/cart/controlplane/discovery/dnstest"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
)

func srvRecords(urls ...string) []string {
	out := []string{"r.pool. 1 IN A 127.0.0.1"}
	for _, u := range urls {
		out = append(out, fmt.Sprintf("_w._tcp.pool. 1 IN SRV 0 0 %s r.pool.", u[strings.LastIndex(u, ":")+1:]))
	}
	return out
}

// workerSources lists the workers (URL -> source) as the cluster sees them,
// or nil while it cannot answer (an election).
func workerSources(url string) map[string]string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	r, err := admin(url).ListWorkers(ctx, connect.NewRequest(&cartv1.ListWorkersRequest{}))
	if err != nil {
		return nil
	}
	out := map[string]string{}
	for _, w := range r.Msg.GetWorkers() {
		out[w.GetUrl()] = w.GetSource()
	}
	return out
}

// waitSources waits until the leader lists want. Only the leader's own
// answer counts: a follower that cannot reach the leader (right after a
// leader is killed, its Raft still names the dead one) answers from its
// local copy, which may lag what was committed; a check passed on such a
// copy once let this test go on before the new leader had removed
// anything, and then fail.
func waitSources(t *testing.T, nodes []*node, what string, want map[string]string) {
	t.Helper()
	testkit.WaitForMsg(t, 15*time.Second, what, func() (bool, string) {
		n := leaderNow(nodes)
		if n == nil {
			return false, "no node reports itself leader"
		}
		got := workerSources(n.url())
		return fmt.Sprint(got) == fmt.Sprint(want), fmt.Sprintf("leader %s lists %v, want %v", n.id, got, want)
	})
}

// The leader discovers workers through DNS as replicated upserts tagged
// "dns" beside the static seed; after the leader is killed, the new
// leader's watcher continues from the replicated set and removes a worker
// that left DNS, never touching the static one.
func TestLeaderRunsDNSDiscovery(t *testing.T) {
	static, d1, d2 := replica(t, "s"), replica(t, "d1"), replica(t, "d2")
	ns := dnstest.Start(t)
	ns.Set(t, srvRecords(d1, d2)...)
	// The replicas listen on loopback, which discovery refuses unless told.
	procs := startCluster(t, []string{static}, fmt.Sprintf(`discovery:
  drain_timeout_secs: 5
  allowed_networks: [127.0.0.0/8]
  dns: {name: _w._tcp.pool, record_type: SRV, resolver: "%s", min_interval_secs: 0.05, max_interval_secs: 0.1, remove_after: 2, max_load: 9}
`, ns.Addr))
	leader := waitLeader(t, procs, 10*time.Second)
	waitSources(t, procs, "discovered", map[string]string{static: "static", d1: "dns", d2: "dns"})

	leader.Kill()
	waitLeader(t, procs, 10*time.Second)
	ns.Set(t, srvRecords(d2)...)
	waitSources(t, procs, "d1 removed by the new leader", map[string]string{static: "static", d2: "dns"})

	// Empty answers change nothing: wait until the leader counted more of
	// them than remove_after, then the set must be intact.
	ns.Set(t)
	testkit.WaitFor(t, 15*time.Second, "the leader to count the empty answers", func() bool {
		return discoveryErrors(waitLeader(t, procs, 10*time.Second).url()) >= 4
	})
	waitSources(t, procs, "after empty answers", map[string]string{static: "static", d2: "dns"})
}

// discoveryErrors reads cart_discovery_errors_total{source="dns"} from a
// node's /metrics (0 when absent or unreachable).
func discoveryErrors(base string) float64 {
	v, _, _ := testkit.MetricSample(nil, base+"/metrics", `cart_discovery_errors_total{source="dns"}`)
	return v
}
