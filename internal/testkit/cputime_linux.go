package testkit

import (
	"syscall"
	"time"
	"unsafe"
)

// ThreadCPU is the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID).
// On a box shared with busy neighbours, wall time of a lock hold mostly
// measures how long the thread waited for a core; CPU time measures the
// work done under the lock. Callers pin their goroutine to its thread.
func ThreadCPU() time.Duration {
	var ts syscall.Timespec
	const clockThreadCPUTimeID = 3
	if _, _, e := syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTimeID, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return 0
	}
	return time.Duration(ts.Nano())
}
