package deploy

import (
	"regexp"
	"strings"
	"testing"

	"github.com/cartrouter/cart/config"
)

// The README and the pages of docs/ are what a newcomer follows; these
// tests hold the claims they make about the code to the code.

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
// sets, Kubernetes included, and no page calls Kubernetes discovery
// unbuilt.
func TestDocsNameEveryWorkerSource(t *testing.T) {
	endpoints := string(readFile(t, "docs", "requests.md"))
	row := regexp.MustCompile("(?m)^\\| `GET /workers` \\|.*$").FindString(endpoints)
	if row == "" {
		t.Fatal("docs/requests.md has no GET /workers row in its endpoint table")
	}
	router, raft := string(readFile(t, "proto", "cart", "v1", "router.proto")), string(readFile(t, "proto", "cart", "v1", "raft.proto"))
	for _, s := range workerSources(t) {
		if !strings.Contains(row, "`"+s+"`") {
			t.Errorf("docs/requests.md's GET /workers row does not list source %q: %s", s, row)
		}
		for name, proto := range map[string]string{"router.proto": router, "raft.proto": raft} {
			if !strings.Contains(proto, `"`+s+`"`) {
				t.Errorf("%s's source comment does not list %q", name, s)
			}
		}
	}
	for _, page := range docPages(t) {
		if regexp.MustCompile(`(?i)kubernetes[^.]*planned`).Match(readFile(t, page)) {
			t.Errorf("%s still calls Kubernetes discovery planned; it is built (controlplane/discovery/kubernetes.go)", page)
		}
	}
}

// The distributed quick start is one command that writes nothing outside
// tmp/ and says how to stop; talking to the control plane by hand says
// where buf comes from and shows the dry run.
func TestReadmeDistributedQuickStart(t *testing.T) {
	page := string(readFile(t, "docs", "distributed.md"))
	i := strings.Index(page, "## Try it on one machine")
	if i < 0 {
		t.Fatal("docs/distributed.md has no quick start (## Try it on one machine)")
	}
	j := strings.Index(page[i+1:], "\n## ")
	if j < 0 {
		t.Fatal("docs/distributed.md's quick start is its last section; the next one ends it")
	}
	section := page[i : i+1+j]
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
