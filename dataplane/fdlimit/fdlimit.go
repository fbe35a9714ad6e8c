// Package fdlimit raises the open-files limit at start and refuses to run
// below a minimum: a router holding thousands of long streams (two sockets
// each) runs out of descriptors at the common default of 1024 and then
// fails every new request, which is worse than not starting.
package fdlimit

import (
	"fmt"
	"syscall"
)

// Ensure raises the soft RLIMIT_NOFILE to the hard limit and returns the
// resulting soft limit. If that is below min (0 disables the check) it
// returns an error that says how to fix it.
func Ensure(min uint64) (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("read open-files limit: %w", err)
	}
	if lim.Cur < lim.Max {
		raised := lim
		raised.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err == nil {
			lim = raised
		}
	}
	if min > 0 && lim.Cur < min {
		return lim.Cur, tooLow(lim, min)
	}
	return lim.Cur, nil
}

// Check reports, changing nothing, whether Ensure(min) would succeed: the
// soft limit can always be raised to the hard one, so the hard limit
// decides. --config-check runs it.
func Check(min uint64) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("read open-files limit: %w", err)
	}
	if min > 0 && lim.Max < min {
		return tooLow(lim, min)
	}
	return nil
}

func tooLow(lim syscall.Rlimit, min uint64) error {
	return fmt.Errorf("open-files limit is %d (hard limit %d), below the required %d: "+
		"raise it (ulimit -n %d; systemd LimitNOFILE=%d; docker run --ulimit nofile=%d:%d) "+
		"or, for tests and laptops only, lower server.min_open_files",
		lim.Cur, lim.Max, min, min, min, min, min)
}
