// Package deploy holds the tests of the deployment artifacts in this
// directory and of the Dockerfile at the repository root: each artifact is
// checked by a linter or parsed and asserted on here, so a broken manifest
// fails `go test ./...` (and CI) rather than a deployment.
package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/internal/testkit/proc"
)

// TestMain removes the programs the tests build.
func TestMain(m *testing.M) { proc.Main(m) }

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
	c := proc.Cmd{Path: name, Args: args, Dir: dir}
	if env != nil {
		c.Env = append(os.Environ(), env...)
	}
	r, err := proc.Exec(c)
	return r.Output, err
}

// withSecretFiles replaces every secret file path in cfg by where(path):
// deploy configs name files that exist only at run time (mounted Secrets),
// and Validate reads them.
func withSecretFiles(cfg *config.Config, where func(string) string) {
	a := &cfg.Auth
	for _, p := range []*string{&a.TokenFile, &a.AdminTokenFile, &a.RaftTokenFile, &cfg.Proxy.WorkerAPIKeyFile} {
		if *p != "" {
			*p = where(*p)
		}
	}
	for i := range a.ClientKeys {
		if a.ClientKeys[i].KeyFile != "" {
			a.ClientKeys[i].KeyFile = where(a.ClientKeys[i].KeyFile)
		}
	}
	for i := range cfg.Workers {
		if cfg.Workers[i].APIKeyFile != "" {
			cfg.Workers[i].APIKeyFile = where(cfg.Workers[i].APIKeyFile)
		}
	}
}

// fakeSecrets returns a where function for withSecretFiles that writes a
// distinct secret per path under dir (distinct: Validate refuses one value
// in two roles).
func fakeSecrets(t *testing.T) func(string) string {
	dir := t.TempDir()
	return func(p string) string {
		f := filepath.Join(dir, strings.ReplaceAll(strings.Trim(p, "/"), "/", "_"))
		if err := os.WriteFile(f, []byte("secret-for-"+p), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
}
