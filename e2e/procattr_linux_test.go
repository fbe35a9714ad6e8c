//go:build linux

package e2e

import (
	"os/exec"
	"syscall"
)

// orphanProof makes the child die with the test binary, so a test that
// times out or panics leaves no router, HAProxy or Raft node behind.
func orphanProof(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
