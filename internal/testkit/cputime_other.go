//go:build !linux

package testkit

import "time"

// ThreadCPU is unavailable here: CPU-time metrics read 0.
func ThreadCPU() time.Duration { return 0 }
