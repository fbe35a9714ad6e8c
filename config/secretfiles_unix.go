//go:build unix

package config

import (
	"os"
	"slices"
	"syscall"
)

// fileOwner is the file's owner and group.
func fileOwner(fi os.FileInfo) (uid, gid int, ok bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, false
	}
	return int(st.Uid), int(st.Gid), true
}

// inGroup reports whether this process has gid as its group or a
// supplementary one.
func inGroup(gid int) bool {
	if os.Getegid() == gid || os.Getgid() == gid {
		return true
	}
	groups, err := os.Getgroups()
	return err == nil && slices.Contains(groups, gid)
}
