package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/internal/testkit/proc"
	"github.com/cartrouter/cart/sim"
	"github.com/cartrouter/cart/sim/simtest"
)

// TestSIGHUPReloadsWorkers runs the real binary: SIGHUP after editing the
// config file swaps the worker list, and a SIGHUP with any other change is
// rejected while the process keeps serving.
func TestSIGHUPReloadsWorkers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the cart binary")
	}
	bin := proc.Build(t, ".")
	reps := simtest.URLs(t, 2, func(i int) sim.Config { return sim.Config{Name: fmt.Sprint("r", i)} })
	port := testkit.FreePort(t)
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
	p := proc.Start(t, proc.Cmd{Path: bin, Args: []string{"-c", cfgPath}})
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
		p.WaitFor(t, 10*time.Second, what, func() (bool, string) {
			w := workers()
			return ok(w), fmt.Sprint("workers ", w)
		})
	}
	waitFor("start", func(w []string) bool { return len(w) == 1 && w[0] == reps[0] })

	write("0.3", reps[0], reps[1])
	if err := p.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor("reload adding a worker", func(w []string) bool { return len(w) == 2 })

	// Any other change is rejected: the worker list stays as it was.
	if p.Log.Contains("cache.threshold") {
		t.Fatalf("cache.threshold logged before the rejected reload:\n%s", p.Log.String())
	}
	write("0.5", reps[1])
	if err := p.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// The rejection is logged once the reload has been read and refused;
	// only then is "the list did not change" a verdict.
	p.WaitLog(t, 10*time.Second, "cache.threshold")
	if w := workers(); len(w) != 2 {
		t.Fatalf("rejected reload changed the workers: %v\nlogs:\n%s", w, p.Log.String())
	}
}
