package fdlimit

import (
	"math"
	"strings"
	"syscall"
	"testing"
)

// These tests change the process's RLIMIT_NOFILE, so none runs in parallel
// and each restores the limit it found.
func getLimit(t *testing.T) syscall.Rlimit {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	return lim
}

func restoreLimit(t *testing.T) {
	orig := getLimit(t)
	t.Cleanup(func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
			t.Errorf("restore RLIMIT_NOFILE: %v", err)
		}
	})
}

func TestEnsureRaisesSoftLimitToHard(t *testing.T) {
	restoreLimit(t)
	lim := getLimit(t)
	if lim.Max < 256 {
		t.Skipf("hard limit %d too low to lower the soft one meaningfully", lim.Max)
	}
	low := lim
	low.Cur = 128
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatalf("lower soft limit: %v", err)
	}
	if got := getLimit(t); got.Cur != 128 {
		t.Fatalf("soft limit not lowered: %d", got.Cur)
	}
	n, err := Ensure(200) // more than the lowered soft limit, within the hard one
	if err != nil {
		t.Fatalf("Ensure(200) with hard limit %d: %v", lim.Max, err)
	}
	got := getLimit(t)
	if got.Cur != lim.Max {
		t.Fatalf("soft limit after Ensure = %d, want the hard limit %d", got.Cur, lim.Max)
	}
	if n != got.Cur {
		t.Fatalf("Ensure returned %d, the soft limit is %d", n, got.Cur)
	}
}

func TestEnsureBelowMinimumExplainsTheFix(t *testing.T) {
	restoreLimit(t)
	lim := getLimit(t)
	if lim.Max == ^uint64(0) {
		t.Skip("unlimited hard limit: no minimum can exceed it")
	}
	n, err := Ensure(lim.Max + 1)
	if err == nil {
		t.Fatalf("Ensure(hard+1 = %d) succeeded", lim.Max+1)
	}
	for _, want := range []string{"min_open_files", "ulimit", "LimitNOFILE"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q: %v", want, err)
		}
	}
	if n != lim.Max {
		t.Fatalf("Ensure returned %d, want the (raised) soft limit %d", n, lim.Max)
	}
}

func TestEnsureZeroNeverFails(t *testing.T) {
	restoreLimit(t)
	lim := getLimit(t)
	low := lim
	low.Cur = min(lim.Max, 64)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	n, err := Ensure(0)
	if err != nil {
		t.Fatalf("Ensure(0): %v", err)
	}
	if n != lim.Max {
		t.Fatalf("Ensure(0) left the soft limit at %d, want %d", n, lim.Max)
	}
}

func TestEnsureAtExactlyTheHardLimitSucceeds(t *testing.T) {
	restoreLimit(t)
	lim := getLimit(t)
	if _, err := Ensure(lim.Max); err != nil {
		t.Fatalf("Ensure(hard limit %d): %v", lim.Max, err)
	}
}

// Check answers as Ensure would, from the hard limit, and leaves the soft
// limit where it was.
func TestCheckAgreesWithEnsureWithoutRaising(t *testing.T) {
	restoreLimit(t)
	lim := getLimit(t)
	if lim.Max < 256 || lim.Max == math.MaxUint64 {
		t.Skipf("hard limit %d: cannot test around it", lim.Max)
	}
	low := lim
	low.Cur = 128
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	if err := Check(200); err != nil {
		t.Errorf("Check(200) with hard limit %d: %v (Ensure would raise the soft limit)", lim.Max, err)
	}
	if err := Check(lim.Max + 1); err == nil || !strings.Contains(err.Error(), "server.min_open_files") {
		t.Errorf("Check(hard+1) = %v, want the refusal Ensure gives", err)
	}
	if got := getLimit(t); got.Cur != 128 {
		t.Errorf("Check changed the soft limit to %d", got.Cur)
	}
	if _, err := Ensure(lim.Max + 1); err == nil {
		t.Error("Ensure(hard+1) succeeded: Check's refusal would not match the start")
	}
}
