package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is a child process started by the suite, in its own process group so
// that stopping it also stops whatever it forked (nginx workers).
type Proc struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
}

// Exited reports whether the process has ended, and how.
func (p *Proc) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop sends SIGTERM to the process group, then SIGKILL after grace.
func (p *Proc) Stop(grace time.Duration) {
	if ok, _ := p.Exited(); ok {
		return
	}
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
}

// Kill sends SIGKILL to the process group, as a crash would end it (no
// shutdown, no goodbye to its peers), and waits for it to exit.
func (p *Proc) Kill() {
	if ok, _ := p.Exited(); ok {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Tail returns the last n lines of the process log.
func (p *Proc) Tail(n int) string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Env owns the suite's temporary directory, child processes and ports.
type Env struct {
	Cfg    SuiteConfig
	Log    io.Writer
	Dir    string
	mu     sync.Mutex
	procs  []*Proc
	ports  map[int]bool
	client *http.Client
}

// NewEnv creates a temporary working directory for a suite.
func NewEnv(cfg SuiteConfig, log io.Writer) (*Env, error) {
	dir, err := os.MkdirTemp("", "cart-bench-")
	if err != nil {
		return nil, err
	}
	return &Env{Cfg: cfg, Log: log, Dir: dir, ports: map[int]bool{},
		client: &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}}, nil
}

// Close stops every process still running and removes the directory.
func (e *Env) Close() {
	e.mu.Lock()
	procs := e.procs
	e.procs = nil
	e.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Stop(5 * time.Second)
	}
	_ = os.RemoveAll(e.Dir)
}

// Logf writes a line to the suite log.
func (e *Env) Logf(format string, args ...any) {
	if e.Log != nil {
		_, _ = fmt.Fprintf(e.Log, format+"\n", args...)
	}
}

// FreePort returns a loopback TCP port that is free now and has not been
// handed out before in this suite.
func (e *Env) FreePort() (int, error) {
	for range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close()
		e.mu.Lock()
		taken := e.ports[port]
		e.ports[port] = true
		e.mu.Unlock()
		if !taken {
			return port, nil
		}
	}
	return 0, errors.New("no free port")
}

// Path returns a path inside the suite directory.
func (e *Env) Path(elem ...string) string { return filepath.Join(append([]string{e.Dir}, elem...)...) }

// Start runs bin with args, logging to <dir>/<name>.log.
func (e *Env) Start(name, bin string, args ...string) (*Proc, error) {
	return e.StartEnv(name, bin, nil, args...)
}

// StartEnv is Start with env ("KEY=value") added to the bench's own
// environment.
func (e *Env) StartEnv(name, bin string, env []string, args ...string) (*Proc, error) {
	logPath := e.Path(name + ".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Dir = e.Dir
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	e.mu.Lock()
	e.procs = append(e.procs, p)
	e.mu.Unlock()
	return p, nil
}

// StopAll stops the given processes (last first) and forgets them.
func (e *Env) StopAll(ps []*Proc) {
	for i := len(ps) - 1; i >= 0; i-- {
		ps[i].Stop(5 * time.Second)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	kept := e.procs[:0]
	for _, p := range e.procs {
		stopped := false
		for _, q := range ps {
			stopped = stopped || p == q
		}
		if !stopped {
			kept = append(kept, p)
		}
	}
	e.procs = kept
}

// WaitReady polls check every 100 ms until it returns nil, the process
// exits or the timeout passes; the error then names the cause and the end of
// the process log.
func (e *Env) WaitReady(ctx context.Context, p *Proc, timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		if p != nil {
			if ok, err := p.Exited(); ok {
				return fmt.Errorf("%s exited (%v): %s", p.Name, err, lastLine(p.Tail(5)))
			}
		}
		if last = check(); last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			msg := fmt.Sprintf("not ready after %s: %v", timeout, last)
			if p != nil {
				msg = p.Name + " " + msg
				if t := lastLine(p.Tail(5)); t != "" {
					msg += "; log: " + t
				}
			}
			return errors.New(msg)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// Get fetches url and returns the status and body.
func (e *Env) Get(url string) (int, []byte, error) {
	resp, err := e.client.Get(url)
	if err != nil {
		return 0, nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, b, err
}

// Post sends a JSON body to url and returns the status and body.
func (e *Env) Post(url, body string) (int, []byte, error) {
	resp, err := e.client.Post(url, "application/json", bytes.NewReader([]byte(body)))
	if err != nil {
		return 0, nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, b, err
}

// httpOK is a readiness check: GET url answers 200.
func (e *Env) httpOK(url string) func() error {
	return func() error {
		code, body, err := e.Get(url)
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("GET %s: %d %s", url, code, strings.TrimSpace(string(body)))
		}
		return nil
	}
}

// tcpOpen is a readiness check: the port accepts connections.
func tcpOpen(port int) func() error {
	return func() error {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	}
}

func hostPort(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }

func baseURL(port int) string { return "http://" + hostPort(port) }
