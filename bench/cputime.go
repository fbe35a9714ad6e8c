package bench

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTick is Linux's USER_HZ, the unit of the CPU times in /proc (100
// on every mainstream kernel configuration).
const clockTick = 10 * time.Millisecond

// CPUTime is the user+system CPU time used so far by the process and its
// direct children (nginx's workers), read from /proc; 0 where there is no
// /proc.
func (p *Proc) CPUTime() time.Duration {
	if p == nil || p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return procTreeCPU(p.cmd.Process.Pid)
}

func procTreeCPU(pid int) time.Duration {
	total, _ := procCPU(strconv.Itoa(pid))
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, st := range stats {
		id := filepath.Base(filepath.Dir(st))
		if cpu, ppid := procCPU(id); ppid == pid {
			total += cpu
		}
	}
	return total
}

// procCPU reads utime+stime and the parent of one process.
func procCPU(pid string) (time.Duration, int) {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return 0, -1
	}
	return parseStat(string(b))
}

// parseStat reads utime+stime and the parent from a /proc/<pid>/stat line.
func parseStat(s string) (time.Duration, int) {
	// The command name, in parentheses, may hold spaces and parentheses:
	// fields are counted from its last closing parenthesis.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, -1
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state): ppid is field 4, utime 14, stime 15.
	if len(f) < 13 {
		return 0, -1
	}
	ppid, _ := strconv.Atoi(f[1])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * clockTick, ppid
}
