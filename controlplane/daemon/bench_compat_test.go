package daemon_test

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/cartrouter/cart/internal/testkit/proc"
)

// What follows is only for bench_test.go, the load generator that is moving
// to bench/ (cart-bench): it starts its processes itself. Delete this file
// with it, and the benchBinary call in TestMain.

// cartBin is the cart binary, built by TestMain only when benchmarks run.
var cartBin string

func benchBinary() {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		return
	}
	bin, err := proc.BuildErr(cartPkg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cartBin = bin
}

type cpProc struct {
	id, api, raft, dir, cfg string
	cmd                     *exec.Cmd
}

func (p *cpProc) url() string { return "http://" + p.api }

func (p *cpProc) stop(sig syscall.Signal) {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(proc.Grace):
		_ = p.cmd.Process.Kill()
		<-done
	}
	p.cmd = nil
}
