package raftnode

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// CheckDataDir reports what a start on dir with logStore would refuse,
// changing nothing and without the data dir's lock (a node running on dir
// holds it, and checking its config must not fail for that): a path that
// cannot become a directory, and a log of the other kind than the one
// asked for (see logKind). --config-check runs it.
func CheckDataDir(dir, logStore string) error {
	fi, err := os.Stat(dir)
	switch {
	case err == nil && !fi.IsDir():
		return fmt.Errorf("raftnode: data dir %s is not a directory", dir)
	case err == nil:
		_, err = logKind(dir, logStore)
		return err
	case !missing(err):
		return fmt.Errorf("raftnode: data dir: %w", err)
	}
	// Not there yet: the start creates it, and its missing parents, under
	// its nearest existing ancestor.
	for p := filepath.Dir(filepath.Clean(dir)); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		switch {
		case err == nil && !fi.IsDir():
			return fmt.Errorf("raftnode: data dir %s cannot be created: %s is not a directory", dir, p)
		case err == nil:
			if err := unix.Access(p, unix.W_OK|unix.X_OK); err != nil {
				return fmt.Errorf("raftnode: data dir %s cannot be created in %s: %w", dir, p, err)
			}
			return nil
		case !missing(err):
			return fmt.Errorf("raftnode: data dir %s: %w", dir, err)
		case p == filepath.Dir(p):
			return nil
		}
	}
}

// missing: nothing at the path, or a file where a directory on it should be
// (which the walk up then names).
func missing(err error) bool {
	return errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENOTDIR)
}
