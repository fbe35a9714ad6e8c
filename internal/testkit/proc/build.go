// Package proc runs the programs a test starts as child processes: it
// builds a main package once per test binary, starts the program with its
// output kept in a bounded buffer (shown when the test fails), waits for it
// to be ready by polling a condition, signals and stops it, and stops it at
// the end of the test whatever happens, so no process outlives its test.
package proc

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

var builds struct {
	mu   sync.Mutex
	dir  string // one per test binary: go test runs packages in parallel
	bins map[string]*build
}

type build struct {
	once sync.Once
	path string
	err  error
}

// Build compiles the main package pkg (an import path, or a directory such
// as "." relative to the test's package) with env added to the environment,
// once per test binary, and returns the program's path. Every test after
// the first gets the same program, or the same build failure.
func Build(t testing.TB, pkg string, env ...string) string {
	t.Helper()
	path, err := BuildErr(pkg, env...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return path
}

// BuildErr is Build for where there is no test to fail (TestMain).
func BuildErr(pkg string, env ...string) (string, error) {
	b, err := buildEntry(pkg, env)
	if err != nil {
		return "", err
	}
	b.once.Do(func() {
		cmd := exec.Command("go", "build", "-o", b.path, pkg)
		if len(env) > 0 {
			cmd.Env = append(os.Environ(), env...)
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	})
	return b.path, b.err
}

func buildEntry(pkg string, env []string) (*build, error) {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	key := pkg + "\x00" + strings.Join(env, "\x00")
	if b, ok := builds.bins[key]; ok {
		return b, nil
	}
	if builds.dir == "" {
		dir, err := os.MkdirTemp("", "cart-testbin-")
		if err != nil {
			return nil, err
		}
		builds.dir, builds.bins = dir, map[string]*build{}
	}
	name := filepath.Base(pkg)
	if pkg == "." {
		if wd, err := os.Getwd(); err == nil {
			name = filepath.Base(wd)
		}
	}
	// A subdirectory per entry: the same package built with two
	// environments must not overwrite itself.
	sub := filepath.Join(builds.dir, strconv.Itoa(len(builds.bins)))
	if err := os.Mkdir(sub, 0o755); err != nil {
		return nil, err
	}
	b := &build{path: filepath.Join(sub, name)}
	builds.bins[key] = b
	return b, nil
}

// RemoveBuilds deletes what Build compiled. TestMain calls it (through Main
// or Exit) once every test has run.
func RemoveBuilds() {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if builds.dir != "" {
		_ = os.RemoveAll(builds.dir)
		builds.dir, builds.bins = "", nil
	}
}

// Main is a TestMain body for a package whose tests use Build.
func Main(m *testing.M) { Exit(m.Run()) }

// Exit removes the builds and exits with code; it fits goleak's
// VerifyTestMain(m, goleak.Cleanup(proc.Exit)).
func Exit(code int) {
	RemoveBuilds()
	os.Exit(code)
}
