//go:build !linux

package testkit

import (
	"testing"
	"time"
)

// InOwnNetns skips: network namespaces are Linux's.
func InOwnNetns(t *testing.T, _ time.Duration) bool {
	t.Helper()
	t.Skip("network namespaces need Linux")
	return false
}
