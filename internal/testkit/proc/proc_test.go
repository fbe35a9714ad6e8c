package proc

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/cartrouter/cart/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, goleak.Cleanup(Exit)) }

func child(t *testing.T, args ...string) Cmd {
	return Cmd{Name: "child", Path: Build(t, "./testdata/child"), Args: args}
}

// fakeTB keeps the cleanups and failure messages to itself, so a test can
// run them and read them; it reports itself failed.
type fakeTB struct {
	testing.TB
	cleanups []func()
	logs     []string
	fatal    string
}

func (f *fakeTB) Helper()                 {}
func (f *fakeTB) Cleanup(fn func())       { f.cleanups = append(f.cleanups, fn) }
func (f *fakeTB) Failed() bool            { return true }
func (f *fakeTB) Logf(s string, a ...any) { f.logs = append(f.logs, fmt.Sprintf(s, a...)) }
func (f *fakeTB) Fatalf(s string, a ...any) {
	if f.fatal == "" {
		f.fatal = fmt.Sprintf(s, a...)
	}
}
func (f *fakeTB) runCleanups() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}

func TestBuildIsDoneOncePerTestBinary(t *testing.T) {
	a := Build(t, "./testdata/child")
	st, err := os.Stat(a)
	if err != nil {
		t.Fatal(err)
	}
	if b := Build(t, "./testdata/child"); b != a {
		t.Fatalf("second build at %s, first at %s", b, a)
	}
	if st2, _ := os.Stat(a); !st2.ModTime().Equal(st.ModTime()) {
		t.Fatal("the program was rebuilt")
	}
	if c := Build(t, "./testdata/child", "CGO_ENABLED=0"); c == a {
		t.Fatal("a build with another environment overwrote the first")
	}
}

func TestBuildFailureFailsTheTest(t *testing.T) {
	f := &fakeTB{TB: t}
	Build(f, "./testdata/no-such-package")
	if !strings.Contains(f.fatal, "go build ./testdata/no-such-package") {
		t.Fatalf("failure %q does not name the build", f.fatal)
	}
}

func TestReadySignalsAndGracefulStop(t *testing.T) {
	addr := testkit.FreeAddr(t)
	p := Start(t, child(t, "-listen", addr))
	p.WaitFor(t, 10*time.Second, "HTTP", HTTPOK("http://"+addr+"/"))
	if err := p.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	p.WaitLog(t, 10*time.Second, "got hangup")
	p.Terminate()
	if p.Running() || !p.Log.Contains("got terminated") || !p.Log.Contains("exit: <nil>") {
		t.Fatalf("after Terminate: running %v, output:\n%s", p.Running(), p.Log.String())
	}
	if err := p.Signal(syscall.SIGHUP); err == nil {
		t.Fatal("signalling a stopped process succeeded")
	}
	// Restartable with the same command.
	p.Start(t)
	p.WaitFor(t, 10*time.Second, "HTTP again", HTTPOK("http://"+addr+"/"))
}

func TestStopEscalatesToKill(t *testing.T) {
	p := Start(t, child(t, "-ignore-term"))
	p.WaitLog(t, 10*time.Second, "started")
	start := time.Now()
	p.Stop(syscall.SIGTERM, 200*time.Millisecond)
	if p.Running() || !p.Log.Contains("got terminated") || !p.Log.Contains("signal: killed") {
		t.Fatalf("after Stop: running %v, output:\n%s", p.Running(), p.Log.String())
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Fatalf("killed after %v, before the grace", d)
	}
}

func TestCleanupKillsAndShowsOutputOnFailure(t *testing.T) {
	f := &fakeTB{TB: t}
	p := Start(f, child(t, "-ignore-term"))
	p.WaitLog(t, 10*time.Second, "started")
	p.Kill()
	// A restart, here under a subtest's TB, adds no cleanup: ending the
	// subtest must not stop a process its parent still uses.
	sub := &fakeTB{TB: t}
	p.Start(sub)
	testkit.WaitFor(t, 10*time.Second, "the second start", func() bool { return strings.Count(p.Log.String(), "started\n") == 2 })
	if len(f.cleanups) != 1 || len(sub.cleanups) != 0 {
		t.Fatalf("%d cleanups registered by the first start, %d by the restart; want 1 and 0", len(f.cleanups), len(sub.cleanups))
	}
	f.runCleanups()
	if p.Running() {
		t.Fatal("the cleanup left the process running")
	}
	if len(f.logs) != 1 || !strings.Contains(f.logs[0], "child output") || strings.Count(f.logs[0], "started\n") != 2 {
		t.Fatalf("failed test logged %q", f.logs)
	}
}

func TestWaitForStopsWhenTheProcessExits(t *testing.T) {
	f := &fakeTB{TB: t}
	p := Start(t, child(t, "-exit", "3"))
	if code := p.ExitCode(t, 10*time.Second); code != 3 {
		t.Fatalf("exit code %d, want 3", code)
	}
	p.WaitFor(f, 300*time.Millisecond, "never", func() (bool, string) { return false, "" })
	if !strings.Contains(f.fatal, "child exited while waiting for never") || !strings.Contains(f.fatal, "to stderr") {
		t.Fatalf("failure %q", f.fatal)
	}
}

func TestRunReturnsStreamsAndCode(t *testing.T) {
	r := Run(t, child(t, "-exit", "3"))
	if r.Code != 3 || r.Stdout != "to stdout\n" || r.Stderr != "to stderr\n" ||
		!strings.Contains(r.Output, "to stdout\n") || !strings.Contains(r.Output, "to stderr\n") {
		t.Fatalf("%+v", r)
	}
	env := child(t, "-exit", "0")
	env.Env = []string{"PATH=/nonexistent"}
	if r := Run(t, env); r.Code != 0 {
		t.Fatalf("%+v", r)
	}
	f := &fakeTB{TB: t}
	Run(f, Cmd{Path: "/nonexistent/program"})
	if !strings.Contains(f.fatal, "run program") {
		t.Fatalf("a program that cannot start: %q", f.fatal)
	}
}

func TestLogBufferIsBounded(t *testing.T) {
	var l LogBuffer
	line := strings.Repeat("x", 1023) + "\n"
	for range 3 * LogCap / len(line) {
		_, _ = l.Write([]byte(line))
	}
	_, _ = l.Write([]byte("last\n"))
	if s := l.String(); len(s) > LogCap || !strings.HasSuffix(s, "last\n") {
		t.Fatalf("kept %d bytes ending %q", len(s), s[len(s)-10:])
	}
	if tail := l.Tail(5); tail != "...\nlast\n" {
		t.Fatalf("tail %q", tail)
	}
}

func TestRemoveBuildsDeletesThePrograms(t *testing.T) {
	a := Build(t, "./testdata/child")
	RemoveBuilds()
	if _, err := os.Stat(a); !os.IsNotExist(err) {
		t.Fatalf("%s still there after RemoveBuilds: %v", a, err)
	}
	// The next Build starts afresh.
	if b := Build(t, "./testdata/child"); b == a {
		t.Fatalf("rebuilt at the removed path %s", b)
	} else if _, err := os.Stat(b); err != nil {
		t.Fatal(err)
	}
}
