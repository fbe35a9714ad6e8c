// Package testkit holds helpers shared by the tests of every package. It
// imports nothing from the project so that any package may use it without
// an import cycle.
package testkit

import (
	"testing"
	"time"
)

// The poll interval starts short, so a condition that is met almost at once
// costs the test next to nothing, and grows to a cap, so a long wait (or a
// condition that does I/O) does not spin on a machine shared with other
// test binaries.
const (
	firstInterval = time.Millisecond
	maxInterval   = 20 * time.Millisecond
)

// WaitFor polls cond until it holds and fails the test, naming what it was
// waiting for, if it does not within timeout.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	WaitForMsg(t, timeout, what, func() (bool, string) { return cond(), "" })
}

// WaitForMsg is WaitFor for a condition that also reports where it stands;
// the last report is in the failure message, which usually tells why the
// wait failed without rerunning the test.
func WaitForMsg(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	if ok, last := Poll(timeout, cond); !ok {
		if last != "" {
			t.Fatalf("timed out after %v waiting for %s (last: %s)", timeout, what, last)
		} else {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
	}
}

// Poll polls cond until it holds or timeout passes, and returns whether it
// held with its last report. It is for tests that assert a condition does
// NOT become true, or that fail in their own words.
func Poll(timeout time.Duration, cond func() (bool, string)) (bool, string) {
	deadline := time.Now().Add(timeout)
	interval := firstInterval
	for {
		ok, last := cond()
		if ok {
			return true, last
		}
		if !time.Now().Before(deadline) {
			return false, last
		}
		time.Sleep(min(interval, time.Until(deadline)+time.Millisecond))
		interval = min(2*interval, maxInterval)
	}
}

// Recv takes one value from ch and fails the test, naming what it was
// waiting for, if none comes within timeout: a test waiting on a result
// that never arrives fails instead of hanging until the binary's timeout.
func Recv[T any](t testing.TB, ch <-chan T, timeout time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(timeout):
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
		var zero T
		return zero
	}
}
