package daemon_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cartrouter/cart/controlplane/cpclient"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/internal/testkit/proc"
	"github.com/cartrouter/cart/sim"
	"github.com/cartrouter/cart/sim/simtest"
)

const cartPkg = "github.com/cartrouter/cart/cli/cart"

func TestMain(m *testing.M) {
	proc.Main(m)
}

// node is one `cart controlplane` process of a test.
type node struct {
	*proc.Proc
	id, api, raft, dir, cfg string
	token                   string // auth.token, sent by the test's clients too
}

func (n *node) url() string { return "http://" + n.api }

func (n *node) admin() cartv1connect.AdminServiceClient { return adminWith(n.url(), n.token) }

func (n *node) status() (*cartv1.ClusterStatusResponse, error) { return statusWith(n.url(), n.token) }

// nodeOpts shapes the configs of the nodes a test lays out. Each node gets
// fast health probes (0.5 s) and placement batches (5 ms), so tests wait
// less.
type nodeOpts struct {
	log   string // the log block; {level: warn} if empty
	token string // auth.token of every node
	// raftToken is auth.raft_token of every node (the Raft handshake);
	// raftTransition sets auth.raft_accept_cluster_token too.
	raftToken      string
	raftTransition bool
	cp             string   // more controlplane keys, each line indented by two spaces
	workers        []string // the worker set the first node bootstraps with
	extra          string   // top-level YAML after the rest
}

// layoutNodes gives count nodes their addresses, data dirs and config
// files (the first bootstraps, the others join it) without starting them.
func layoutNodes(t *testing.T, count int, o nodeOpts) []*node {
	t.Helper()
	bin := proc.Build(t, cartPkg)
	base := t.TempDir()
	if o.log == "" {
		o.log = "{level: warn}"
	}
	var nodes []*node
	for i := 1; i <= count; i++ {
		n := &node{id: fmt.Sprintf("n%d", i), api: testkit.FreeAddr(t), raft: testkit.FreeAddr(t),
			dir: filepath.Join(base, fmt.Sprintf("d%d", i)), cfg: filepath.Join(base, fmt.Sprintf("n%d.yaml", i)), token: o.token}
		n.Proc = &proc.Proc{Cmd: proc.Cmd{Name: n.id, Path: bin, Args: []string{"controlplane", "-c", n.cfg}}}
		nodes = append(nodes, n)
	}
	for i, n := range nodes {
		var sb strings.Builder
		fmt.Fprintf(&sb, "server: {min_open_files: 0}\nlog: %s\nhealth: {interval_secs: 0.5, timeout_secs: 0.4}\n", o.log)
		var auth []string
		if o.token != "" {
			auth = append(auth, "token: "+o.token)
		}
		if o.raftToken != "" {
			auth = append(auth, "raft_token: "+o.raftToken)
		}
		if o.raftTransition {
			auth = append(auth, "raft_accept_cluster_token: true")
		}
		if len(auth) > 0 {
			fmt.Fprintf(&sb, "auth: {%s}\n", strings.Join(auth, ", "))
		}
		fmt.Fprintf(&sb, "controlplane:\n  node_id: %s\n  api_addr: %s\n  raft_addr: %s\n  data_dir: %s\n  placement_batch_ms: 5\n%s", n.id, n.api, n.raft, n.dir, o.cp)
		if i == 0 {
			sb.WriteString("  bootstrap: true\n")
			if len(o.workers) > 0 {
				sb.WriteString("workers:\n")
			}
			for _, w := range o.workers {
				fmt.Fprintf(&sb, "  - url: %s\n", w)
			}
		} else {
			fmt.Fprintf(&sb, "  join: [%s]\n", nodes[0].url())
		}
		sb.WriteString(o.extra)
		writeFile(t, n.cfg, sb.String())
	}
	return nodes
}

// startNodes lays out count nodes and starts them: the first until it
// leads, then the others, until every node lists every one as a voter.
func startNodes(t *testing.T, count int, o nodeOpts) []*node {
	t.Helper()
	nodes := layoutNodes(t, count, o)
	nodes[0].Start(t)
	waitLeader(t, nodes[:1], 10*time.Second)
	for _, n := range nodes[1:] {
		n.Start(t)
	}
	// Every node, not only the first: a node that has not yet applied the
	// configuration adding another would refuse that one's votes, and a
	// test that kills the leader at once could be left without a quorum.
	for _, n := range nodes {
		n.WaitFor(t, 15*time.Second, "the cluster to form", func() (bool, string) {
			st, err := n.status()
			return err == nil && len(st.GetMembers()) == count && st.GetLeaderUrl() != "", fmt.Sprint(st, err)
		})
	}
	return nodes
}

// startCluster starts three nodes; the first bootstraps with workers, every
// config ends with extra.
func startCluster(t *testing.T, workers []string, extra string) []*node {
	t.Helper()
	return startNodes(t, 3, nodeOpts{workers: workers, extra: extra})
}

// waitLeader waits until some running node reports itself leader and
// returns it.
func waitLeader(t *testing.T, nodes []*node, within time.Duration) *node {
	t.Helper()
	var leader *node
	testkit.WaitFor(t, within, "a leader", func() bool {
		leader = leaderNow(nodes)
		return leader != nil
	})
	return leader
}

// leaderNow is the first running node that reports itself leader, or nil.
func leaderNow(nodes []*node) *node {
	for _, n := range nodes {
		if !n.Running() {
			continue
		}
		if st, err := n.status(); err == nil && st.GetState() == "leader" {
			return n
		}
	}
	return nil
}

var client = cpclient.NewWithTLS(nil)

// adminWith is an AdminService client sending token as a bearer ("" sends
// none).
func adminWith(url, token string) cartv1connect.AdminServiceClient {
	opts := []connect.ClientOption{connect.WithGRPC()}
	if token != "" {
		opts = append(opts, connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set("Authorization", "Bearer "+token)
				return next(ctx, req)
			}
		})))
	}
	return cartv1connect.NewAdminServiceClient(client, url, opts...)
}

func admin(url string) cartv1connect.AdminServiceClient { return adminWith(url, "") }

func routerc(url string) cartv1connect.RouterServiceClient {
	return cartv1connect.NewRouterServiceClient(client, url, connect.WithGRPC())
}

func statusWith(url, token string) (*cartv1.ClusterStatusResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	r, err := adminWith(url, token).ClusterStatus(ctx, connect.NewRequest(&cartv1.ClusterStatusRequest{}))
	if err != nil {
		return nil, err
	}
	return r.Msg, nil
}

func status(url string) (*cartv1.ClusterStatusResponse, error) { return statusWith(url, "") }

func replica(t *testing.T, name string) string {
	t.Helper()
	// Serving "m", the model the tests route: the leader routes a model
	// only to workers whose /v1/models lists it.
	return simtest.Start(t, sim.Config{Name: name, Models: []string{"m"}}).URL
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}
