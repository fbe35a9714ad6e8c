package testkit

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// netnsChildEnv marks a test binary InOwnNetns re-ran.
const netnsChildEnv = "CART_TESTKIT_NETNS_CHILD"

// InOwnNetns makes the calling test run in a network namespace of its
// own, where every address a program binds, 0.0.0.0 included, is reached
// from that namespace only: for tests of third-party servers that cannot
// be told to bind loopback. In the test process it re-runs the test in a
// child process in a new namespace, passes on its result (a skip stays a
// skip) and returns false: the caller returns. In the child it brings
// loopback up and returns true: the caller goes on. It needs root and the
// ip command; without them the test skips.
func InOwnNetns(t *testing.T, timeout time.Duration) bool {
	t.Helper()
	if os.Getenv(netnsChildEnv) != "" {
		if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
			t.Skipf("cannot bring up loopback in the new network namespace: %v: %s", err, out)
		}
		return true
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skipf("needs the ip command (apt-get install -y iproute2): %v", err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.v", "-test.count=1", "-test.timeout="+timeout.String())
	cmd.Env = append(os.Environ(), netnsChildEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start a process in a new network namespace: %v", err)
	}
	err := cmd.Wait()
	text := out.String()
	if m := regexp.MustCompile(`(?m)^\s+\S+_test\.go:\d+: (.*)\n--- SKIP`).FindStringSubmatch(text); m != nil {
		t.Skip(m[1])
	}
	if err != nil {
		t.Fatalf("in its own network namespace: %v\n%s", err, text)
	}
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, "_test.go:") {
			t.Log(strings.TrimSpace(line))
		}
	}
	return false
}
