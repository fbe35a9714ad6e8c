//go:build linux

package proc

import (
	"os/exec"
	"syscall"
)

// orphanProof makes the child die with the test binary, so a test that
// times out or panics (its cleanups never run) leaves no process behind.
func orphanProof(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
