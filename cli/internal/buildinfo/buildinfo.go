// Package buildinfo carries the version stamped in at link time.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set with -ldflags "-X github.com/cartrouter/cart/cli/internal/buildinfo.Version=..."
var (
	Version = "dev"
	Commit  = ""
)

// String is the one-line version report of every binary.
func String(binary string) string {
	commit := Commit
	if commit == "" {
		commit = "unknown"
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" {
					commit = s.Value
				}
			}
		}
	}
	return fmt.Sprintf("%s %s (commit %s, %s, %s/%s)", binary, Version, commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
