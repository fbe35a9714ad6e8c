package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cartrouter/cart/sim"
)

// TestSIGHUPReloadsWorkers runs the real binary: SIGHUP after editing the
// config file swaps the worker list, and a SIGHUP with any other change is
// rejected while the process keeps serving.
func TestSIGHUPReloadsWorkers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the cart binary")
	}
	bin := filepath.Join(t.TempDir(), "cart")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	var reps []string
	for i := range 2 {
		s := sim.New(sim.Config{Name: fmt.Sprint("r", i)})
		ts := httptest.NewServer(s.Handler())
		t.Cleanup(func() { ts.Close(); _ = s.Close() })
		reps = append(reps, ts.URL)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cfgPath := filepath.Join(t.TempDir(), "cart.yaml")
	write := func(threshold string, workers ...string) {
		body := fmt.Sprintf("server: {host: 127.0.0.1, port: %d, min_open_files: 0}\nlog: {level: info}\ncache: {threshold: %s}\nworkers:\n", port, threshold)
		for _, w := range workers {
			body += fmt.Sprintf("  - url: %s\n", w)
		}
		if err := os.WriteFile(cfgPath, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("0.3", reps[0])
	logs := &syncBuffer{}
	cmd := exec.Command(bin, "-c", cfgPath)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	workers := func() []string {
		resp, err := http.Get(base + "/workers")
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		var v struct {
			Workers []struct{ URL string } `json:"workers"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&v)
		var out []string
		for _, w := range v.Workers {
			out = append(out, w.URL)
		}
		return out
	}
	waitFor := func(what string, ok func([]string) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if ok(workers()) {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("%s: workers %v\nlogs:\n%s", what, workers(), logs.String())
	}
	waitFor("start", func(w []string) bool { return len(w) == 1 && w[0] == reps[0] })

	write("0.3", reps[0], reps[1])
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor("reload adding a worker", func(w []string) bool { return len(w) == 2 })

	// Any other change is rejected: the worker list stays as it was.
	if bytes.Contains([]byte(logs.String()), []byte("cache.threshold")) {
		t.Fatalf("cache.threshold logged before the rejected reload:\n%s", logs.String())
	}
	write("0.5", reps[1])
	_ = cmd.Process.Signal(syscall.SIGHUP)
	// The rejection is logged once the reload has been read and refused;
	// only then is "the list did not change" a verdict.
	deadline := time.Now().Add(10 * time.Second)
	for !bytes.Contains([]byte(logs.String()), []byte("cache.threshold")) {
		if time.Now().After(deadline) {
			t.Fatalf("rejection does not name the differing key:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if w := workers(); len(w) != 2 {
		t.Fatalf("rejected reload changed the workers: %v\nlogs:\n%s", w, logs.String())
	}
}

// syncBuffer is a bytes.Buffer safe to read while the child process's
// output is being copied into it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
