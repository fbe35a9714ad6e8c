package bench

import (
	"os"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	line := "4242 (nginx: worker (x) ) S 4200 4200 4200 0 -1 4194624 100 0 0 0 250 75 0 0 20 0 1 0 100 0 0"
	cpu, ppid := parseStat(line)
	if cpu != 325*clockTick || ppid != 4200 {
		t.Fatalf("cpu %v ppid %d, want %v 4200", cpu, ppid, 325*clockTick)
	}
	if _, ppid := parseStat("garbage"); ppid != -1 {
		t.Fatalf("garbage parsed, ppid %d", ppid)
	}
}

// This process's own CPU time is read and grows as it works.
func TestProcTreeCPU(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	before := procTreeCPU(os.Getpid())
	deadline := time.Now().Add(5 * time.Second)
	x := 0
	for procTreeCPU(os.Getpid()) <= before {
		if time.Now().After(deadline) {
			t.Fatalf("CPU time did not grow from %v", before)
		}
		for i := range 1_000_000 {
			x += i
		}
	}
	_ = x
}
