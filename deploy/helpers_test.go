// Package deploy holds the tests of the deployment artifacts in this
// directory and of the Dockerfile at the repository root: each artifact is
// checked by a linter or parsed and asserted on here, so a broken manifest
// fails `go test ./...` (and CI) rather than a deployment.
package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// repoRoot is the module root: this file lives in <root>/deploy.
func repoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test source")
	}
	return filepath.Dir(filepath.Dir(file))
}

func path(t testing.TB, rel ...string) string {
	return filepath.Join(append([]string{repoRoot(t)}, rel...)...)
}

func readFile(t testing.TB, rel ...string) []byte {
	t.Helper()
	b, err := os.ReadFile(path(t, rel...))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// inCI reports whether the tests run under .ci/run, which installs every
// external checker: there a missing tool is a failure, not a skip.
func inCI() bool {
	v := strings.ToLower(os.Getenv("CI"))
	return v != "" && v != "0" && v != "false"
}

// tool finds an external checker. Candidates are tried in order (an
// absolute path, or a name looked up in PATH). Outside CI a missing tool
// skips the test with the way to install it; in CI it fails.
func tool(t testing.TB, install string, candidates ...string) string {
	t.Helper()
	for _, c := range candidates {
		if c == "" {
			continue
		}
		if filepath.IsAbs(c) {
			if st, err := os.Stat(c); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
				return c
			}
			continue
		}
		if p, err := exec.LookPath(c); err == nil {
			return p
		}
	}
	msg := candidates[len(candidates)-1] + " not found (" + install + ")"
	if inCI() {
		t.Fatalf("%s; CI installs it in .ci/run, so its absence is a CI setup error", msg)
	}
	t.Skipf("%s; skipping (it is required when CI is set)", msg)
	return ""
}

// run executes a command in dir and returns its combined output; a
// non-zero exit fails the test with that output.
func run(t testing.TB, dir string, name string, args ...string) string {
	t.Helper()
	out, err := runErr(dir, nil, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func runErr(dir string, env []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	return buf.String(), err
}
