package proc

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
)

// Grace is how long Stop waits after a first signal before SIGKILL.
const Grace = 10 * time.Second

// dumpTail is how much of each process's output a failed test shows: enough
// for the last errors, not so much that a dozen processes bury them.
const dumpTail = 8 << 10

// Cmd says what to run.
type Cmd struct {
	Name string   // in log lines and failure messages; the program's base name if empty
	Path string   // the program
	Args []string // its arguments
	Env  []string // its whole environment; nil inherits the test's
	Dir  string   // its working directory; empty is the test's
}

func (c Cmd) name() string {
	if c.Name != "" {
		return c.Name
	}
	return filepath.Base(c.Path)
}

func (c Cmd) command() *exec.Cmd {
	cmd := exec.Command(c.Path, c.Args...)
	cmd.Env, cmd.Dir = c.Env, c.Dir
	orphanProof(cmd)
	return cmd
}

// Proc is a long-running child process, restartable with the same Cmd.
type Proc struct {
	Cmd
	Log LogBuffer // stdout and stderr of every run, with a line at each start and exit

	mu         sync.Mutex
	cmd        *exec.Cmd
	done       chan struct{}
	registered bool
}

// Start runs c and returns it as a Proc stopped (SIGKILL) when t ends.
func Start(t testing.TB, c Cmd) *Proc {
	t.Helper()
	p := &Proc{Cmd: c}
	p.Start(t)
	return p
}

// Start runs the process (again, after a stop). The first Start registers,
// under its t, a cleanup that kills the process and, if t failed, logs the
// tail of its output; a later Start (a restart in a subtest, say) does not,
// so the process lives until that first test ends.
func (p *Proc) Start(t testing.TB) {
	t.Helper()
	if p.Running() {
		t.Fatalf("%s: started while running", p.name())
	}
	cmd := p.command()
	cmd.Stdout, cmd.Stderr = &p.Log, &p.Log
	fmt.Fprintf(&p.Log, "=== %s start: %s %s\n", time.Now().Format("15:04:05.000"), p.Path, strings.Join(p.Args, " "))
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", p.name(), err)
	}
	done := make(chan struct{})
	go func() {
		err := cmd.Wait()
		fmt.Fprintf(&p.Log, "=== %s exit: %v\n", time.Now().Format("15:04:05.000"), err)
		close(done)
	}()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	register := !p.registered
	p.registered = true
	p.mu.Unlock()
	if register {
		t.Cleanup(func() {
			p.Kill()
			if t.Failed() {
				t.Logf("--- %s output (tail):\n%s", p.name(), p.Log.Tail(dumpTail))
			}
		})
	}
}

func (p *Proc) current() (*exec.Cmd, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd, p.done
}

// Running reports whether the process has been started and not yet exited.
func (p *Proc) Running() bool {
	_, done := p.current()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// Pid is the process id of the last run (0 before the first).
func (p *Proc) Pid() int {
	cmd, _ := p.current()
	if cmd == nil || cmd.Process == nil {
		return 0
	}
	return cmd.Process.Pid
}

// Signal sends sig to the running process.
func (p *Proc) Signal(sig syscall.Signal) error {
	cmd, _ := p.current()
	if !p.Running() {
		return fmt.Errorf("%s is not running", p.name())
	}
	return cmd.Process.Signal(sig)
}

// Stop sends sig and waits for the process to exit, killing it after grace.
// A process that is not running is left alone.
func (p *Proc) Stop(sig syscall.Signal, grace time.Duration) {
	cmd, done := p.current()
	if !p.Running() {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Terminate is a graceful stop: SIGTERM, SIGKILL after Grace.
func (p *Proc) Terminate() { p.Stop(syscall.SIGTERM, Grace) }

// Kill is kill -9, waiting for the exit.
func (p *Proc) Kill() { p.Stop(syscall.SIGKILL, Grace) }

// ExitCode waits up to timeout for the process to exit by itself and
// returns its exit code; it fails the test if the process is still running.
func (p *Proc) ExitCode(t testing.TB, timeout time.Duration) int {
	t.Helper()
	cmd, done := p.current()
	if done == nil {
		t.Fatalf("%s was never started", p.name())
	}
	select {
	case <-done:
	case <-time.After(timeout):
		t.Fatalf("%s still running after %v:\n%s", p.name(), timeout, p.Log.Tail(dumpTail))
	}
	return cmd.ProcessState.ExitCode()
}

// WaitFor polls cond like testkit.WaitForMsg, failing at once with the
// process's output if the process exits meanwhile (it will not get ready).
func (p *Proc) WaitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	testkit.WaitForMsg(t, timeout, p.name()+": "+what, func() (bool, string) {
		if !p.Running() {
			t.Fatalf("%s exited while waiting for %s:\n%s", p.name(), what, p.Log.Tail(dumpTail))
		}
		return cond()
	})
}

// WaitLog waits until the process's output contains s.
func (p *Proc) WaitLog(t testing.TB, timeout time.Duration, s string) {
	t.Helper()
	testkit.WaitFor(t, timeout, fmt.Sprintf("%s to log %q", p.name(), s), func() bool { return p.Log.Contains(s) })
}

// httpc polls without keep-alive: an idle connection left behind by a
// readiness check would show up as a leaked goroutine in goleak's eyes.
var httpc = &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// HTTPOK is a readiness condition: GET url answers 200.
func HTTPOK(url string) func() (bool, string) {
	return func() (bool, string) {
		resp, err := httpc.Get(url)
		if err != nil {
			return false, err.Error()
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, fmt.Sprint("status ", resp.StatusCode)
	}
}

// Result is what a command that ran to its end printed and returned.
type Result struct {
	Stdout, Stderr string
	Output         string // both, interleaved as written
	Code           int    // exit code; -1 if it did not run or was killed by a signal
}

// Exec runs c to its end. The error is exec's: an *exec.ExitError for a
// non-zero exit, another error if it could not run.
func Exec(c Cmd) (Result, error) {
	cmd := c.command()
	var stdout, stderr bytes.Buffer
	var both LogBuffer
	cmd.Stdout, cmd.Stderr = io.MultiWriter(&stdout, &both), io.MultiWriter(&stderr, &both)
	err := cmd.Run()
	return Result{Stdout: stdout.String(), Stderr: stderr.String(), Output: both.String(), Code: cmd.ProcessState.ExitCode()}, err
}

// Run runs c to its end and returns what it printed and its exit code; a
// command that cannot run at all fails the test.
func Run(t testing.TB, c Cmd) Result {
	t.Helper()
	r, err := Exec(c)
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("run %s: %v\n%s", c.name(), err, r.Output)
	}
	return r
}
