//go:build !linux

package index

import "time"

// threadCPU is unavailable here: CPU-time metrics read 0.
func threadCPU() time.Duration { return 0 }
