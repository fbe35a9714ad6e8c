package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
)

const module = "github.com/cartrouter/cart"

// pkg is what go list says about one package.
type pkg struct {
	ImportPath   string
	Imports      []string
	Deps         []string
	TestImports  []string
	XTestImports []string
}

var (
	listOnce sync.Once
	listed   map[string]pkg
	listErr  error
)

// listPackages runs go list over the whole module, test imports included,
// once for all tests.
func listPackages(t *testing.T) map[string]pkg {
	t.Helper()
	listOnce.Do(func() { listed, listErr = goList() })
	if listErr != nil {
		t.Fatal(listErr)
	}
	return listed
}

func goList() (map[string]pkg, error) {
	// go test puts its own GOROOT/bin first on PATH, so this is the go
	// command running the test.
	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,Imports,Deps,TestImports,XTestImports", module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %v\n%s", err, stderr.String())
	}
	pkgs := map[string]pkg{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("decode go list output: %w", err)
		}
		pkgs[p.ImportPath] = p
	}
	if len(pkgs) < 10 {
		return nil, fmt.Errorf("go list found only %d packages: the pattern or the working directory is wrong", len(pkgs))
	}
	return pkgs, nil
}

func under(path, dir string) bool {
	return strings.HasPrefix(path, module+"/"+dir+"/")
}

// TestControlPlaneDoesNotImportDataPlane: all-in-one is "a control plane in
// process", so the data plane builds on the control plane and never the
// reverse, not even through a third package.
func TestControlPlaneDoesNotImportDataPlane(t *testing.T) {
	pkgs := listPackages(t)
	for _, p := range sorted(pkgs) {
		if !under(p.ImportPath, "controlplane") {
			continue
		}
		for _, d := range p.Deps {
			if under(d, "dataplane") {
				t.Errorf("%s depends on %s: control-plane packages must not import the data plane", p.ImportPath, d)
			}
		}
	}
}

// controlPlaneTestExceptions are control-plane test files that still drive
// a real data plane against the service, with the reason. The list may only
// shrink: a new test needing a data plane belongs on the data-plane side.
var controlPlaneTestExceptions = map[string]string{
	module + "/controlplane/service -> " + module + "/dataplane/apierr":  serviceE2E,
	module + "/controlplane/service -> " + module + "/dataplane/breaker": serviceE2E,
	module + "/controlplane/service -> " + module + "/dataplane/proxy":   serviceE2E,
	module + "/controlplane/service -> " + module + "/dataplane/remote":  serviceE2E,
	module + "/controlplane/service -> " + module + "/dataplane/router":  serviceE2E,
}

const serviceE2E = "abandon_e2e, models_e2e and responses_e2e tests drive a real remote data plane against the service's in-package harness (fake Raft node, the node's decider); moving them out needs that harness exported"

// TestControlPlaneTestsDoNotImportDataPlane applies the same rule to test
// files, apart from the listed exceptions.
func TestControlPlaneTestsDoNotImportDataPlane(t *testing.T) {
	pkgs := listPackages(t)
	used := map[string]bool{}
	for _, p := range sorted(pkgs) {
		if !under(p.ImportPath, "controlplane") {
			continue
		}
		for _, d := range slices.Concat(p.TestImports, p.XTestImports) {
			if !under(d, "dataplane") {
				continue
			}
			edge := p.ImportPath + " -> " + d
			if _, ok := controlPlaneTestExceptions[edge]; ok {
				used[edge] = true
				continue
			}
			t.Errorf("tests of %s import %s: a test that needs a data plane belongs on the data-plane side", p.ImportPath, d)
		}
	}
	for edge := range controlPlaneTestExceptions {
		if !used[edge] {
			t.Errorf("exception %s is no longer needed: remove it from controlPlaneTestExceptions", edge)
		}
	}
}

// TestProxyDoesNotImportIndex: the proxy hashes key text through the
// router API, so the index's layout stays the routing core's business.
func TestProxyDoesNotImportIndex(t *testing.T) {
	pkgs := listPackages(t)
	p, ok := pkgs[module+"/dataplane/proxy"]
	if !ok {
		t.Fatal("dataplane/proxy not found")
	}
	for _, banned := range []string{module + "/controlplane/index", module + "/controlplane/engine"} {
		if slices.Contains(p.Imports, banned) {
			t.Errorf("dataplane/proxy imports %s: hash through the router package instead", banned)
		}
	}
}

func sorted(pkgs map[string]pkg) []pkg {
	out := make([]pkg, 0, len(pkgs))
	for _, p := range pkgs {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b pkg) int { return strings.Compare(a.ImportPath, b.ImportPath) })
	return out
}
