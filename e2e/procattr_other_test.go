//go:build !linux

package e2e

import "os/exec"

// orphanProof is a no-op off Linux (no parent-death signal); the tests'
// cleanups still kill every child they started.
func orphanProof(*exec.Cmd) {}
