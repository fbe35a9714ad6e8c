package deploy

import (
	"regexp"
	"strings"
	"testing"

	"github.com/cartrouter/cart/config"
)

// The README is what a newcomer follows; these tests hold the claims it
// makes about the code to the code.

// workerSources are every value a worker's source can take
// (config.WorkerSources, which the state machine and discovery use).
func workerSources(t *testing.T) []string {
	t.Helper()
	if len(config.WorkerSources) < 4 {
		t.Fatalf("config.WorkerSources = %v; want static, admin, dns, kubernetes at least", config.WorkerSources)
	}
	return config.WorkerSources
}

// GET /workers and the API's source field document every source the code
// sets, Kubernetes included, and the README no longer calls Kubernetes
// discovery unbuilt.
func TestDocsNameEveryWorkerSource(t *testing.T) {
	readme := string(readFile(t, "README.md"))
	row := regexp.MustCompile("(?m)^\\| `GET /workers` \\|.*$").FindString(readme)
	if row == "" {
		t.Fatal("README has no GET /workers row in its endpoint table")
	}
	router, raft := string(readFile(t, "proto", "cart", "v1", "router.proto")), string(readFile(t, "proto", "cart", "v1", "raft.proto"))
	for _, s := range workerSources(t) {
		if !strings.Contains(row, "`"+s+"`") {
			t.Errorf("README's GET /workers row does not list source %q: %s", s, row)
		}
		for name, proto := range map[string]string{"router.proto": router, "raft.proto": raft} {
			if !strings.Contains(proto, `"`+s+`"`) {
				t.Errorf("%s's source comment does not list %q", name, s)
			}
		}
	}
	if regexp.MustCompile(`(?i)kubernetes[^.]*planned`).MatchString(readme) {
		t.Error("README still calls Kubernetes discovery planned; it is built (controlplane/discovery/kubernetes.go)")
	}
}

// The distributed quick start is one command that writes nothing outside
// tmp/ and says how to stop; talking to the control plane by hand says
// where buf comes from and shows the dry run.
func TestReadmeDistributedQuickStart(t *testing.T) {
	readme := string(readFile(t, "README.md"))
	i := strings.Index(readme, "## Distributed mode")
	j := strings.Index(readme[i+1:], "\n## ")
	if i < 0 || j < 0 {
		t.Fatal("README has no distributed-mode section")
	}
	section := readme[i : i+1+j]
	for _, want := range []string{"make run-cluster", "tmp/cluster/", "Ctrl-C", "make tools", `"dry_run":true`, "--reflect-header"} {
		if !strings.Contains(section, want) {
			t.Errorf("the distributed quick start does not mention %s", want)
		}
	}
	if strings.Contains(section, "cat >") {
		t.Error("the distributed quick start writes files by hand (into the repository root)")
	}
	makefile := string(readFile(t, "Makefile"))
	if !regexp.MustCompile(`(?m)^run-cluster: .*\n\t@deploy/local/cluster\.sh$`).MatchString(makefile) {
		t.Error("Makefile has no run-cluster target running deploy/local/cluster.sh")
	}
	script := string(readFile(t, "deploy", "local", "cluster.sh"))
	if !strings.Contains(script, "dir=${CART_CLUSTER_DIR:-tmp/cluster}") {
		t.Error("cluster.sh does not default to tmp/cluster")
	}
}
