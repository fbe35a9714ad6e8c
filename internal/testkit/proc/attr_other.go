//go:build !linux

package proc

import "os/exec"

// orphanProof is a no-op off Linux (no parent-death signal); the test
// cleanups still stop every child they started.
func orphanProof(*exec.Cmd) {}
