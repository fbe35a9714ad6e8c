package main

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/cartrouter/cart/internal/testkit/proc"
)

func TestMain(m *testing.M) { proc.Main(m) }

// buildEntrypoint compiles this command (once), so it can run under a
// lowered limit in a child process: the limit of the test process itself
// must not change. Static, as in the image.
func buildEntrypoint(t *testing.T) string { return proc.Build(t, ".", "CGO_ENABLED=0") }

func prlimit(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("prlimit")
	if err != nil {
		// prlimit comes with util-linux, which every Debian system has.
		t.Skip("prlimit (util-linux) not installed: cannot run the entrypoint under a lowered limit")
	}
	return p
}

func hardLimit(t *testing.T) uint64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	return lim.Max
}

// runUnder runs the entrypoint with RLIMIT_NOFILE soft:hard and the given
// CART_MIN_OPEN_FILES ("" leaves it unset).
func runUnder(t *testing.T, bin, limits, minOpen string, args ...string) (int, string, string) {
	t.Helper()
	env := []string{"PATH=" + os.Getenv("PATH")}
	if minOpen != "" {
		env = append(env, "CART_MIN_OPEN_FILES="+minOpen)
	}
	r := proc.Run(t, proc.Cmd{Path: prlimit(t), Args: append([]string{"--nofile=" + limits, bin}, args...), Env: env})
	return r.Code, r.Stdout, r.Stderr
}

func TestRefusesBelowDefaultThreshold(t *testing.T) {
	bin := buildEntrypoint(t)
	code, stdout, stderr := runUnder(t, bin, "1024:1024", "", "echo", "should-not-run")
	if code == 0 || strings.Contains(stdout, "should-not-run") {
		t.Fatalf("started under nofile=1024 (exit %d, stdout %q)", code, stdout)
	}
	for _, want := range []string{"open-files limit is 1024", "required 65535", "--ulimit nofile=65535:65535", "ulimits:", "nofile", "Kubernetes", "CART_MIN_OPEN_FILES"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("message lacks %q:\n%s", want, stderr)
		}
	}
}

func TestThresholdOverride(t *testing.T) {
	bin := buildEntrypoint(t)
	// Above the limit: refused, and the message names the overridden value.
	code, _, stderr := runUnder(t, bin, "1024:1024", "2048", "true")
	if code != exitLimit || !strings.Contains(stderr, "required 2048") {
		t.Fatalf("CART_MIN_OPEN_FILES=2048 under 1024: exit %d, stderr %q", code, stderr)
	}
	// At the limit: the command runs and its output and status pass through.
	code, stdout, stderr := runUnder(t, bin, "1024:1024", "1024", "sh", "-c", "echo ok; exit 3")
	if code != 3 || stdout != "ok\n" {
		t.Fatalf("CART_MIN_OPEN_FILES=1024 under 1024: exit %d (want the command's 3), stdout %q, stderr %q", code, stdout, stderr)
	}
	// 0 disables the check.
	if code, _, stderr := runUnder(t, bin, "256:256", "0", "true"); code != 0 {
		t.Fatalf("CART_MIN_OPEN_FILES=0: exit %d: %s", code, stderr)
	}
}

// TestRaisesSoftLimitForTheCommand: a low soft limit under a sufficient
// hard limit is raised, and the exec'd command inherits the raised value
// (the Go runtime would otherwise restore the original soft limit on exec).
func TestRaisesSoftLimitForTheCommand(t *testing.T) {
	hard := hardLimit(t)
	if hard < 4096 {
		t.Skipf("hard open-files limit %d is below 4096", hard)
	}
	bin := buildEntrypoint(t)
	h := strconv.FormatUint(hard, 10)
	code, stdout, stderr := runUnder(t, bin, "1024:"+h, "4096", "sh", "-c", "ulimit -n")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if got := strings.TrimSpace(stdout); got != h {
		t.Fatalf("command saw ulimit -n %s, want the hard limit %s", got, h)
	}
}

func TestUsageAndMissingCommand(t *testing.T) {
	bin := buildEntrypoint(t)
	if code, _, stderr := runUnder(t, bin, "1024:1024", "1024"); code != exitUsage || !strings.Contains(stderr, "no command") {
		t.Errorf("no args: exit %d (want %d): %s", code, exitUsage, stderr)
	}
	if code, _, stderr := runUnder(t, bin, "1024:1024", "lots", "true"); code != exitUsage || !strings.Contains(stderr, "CART_MIN_OPEN_FILES") {
		t.Errorf("bad threshold: exit %d (want %d): %s", code, exitUsage, stderr)
	}
	if code, _, stderr := runUnder(t, bin, "1024:1024", "1024", "no-such-cart-binary"); code != exitNotFound || !strings.Contains(stderr, "not found") {
		t.Errorf("missing command: exit %d (want %d): %s", code, exitNotFound, stderr)
	}
}
