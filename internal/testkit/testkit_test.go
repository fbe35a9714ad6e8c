package testkit

import (
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fatalTB records Fatalf instead of stopping the test, so the failure path
// of WaitFor can be asserted.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
}

func TestWaitForReturnsOnceTheConditionHolds(t *testing.T) {
	var n atomic.Int32
	WaitFor(t, 5*time.Second, "three calls", func() bool { return n.Add(1) >= 3 })
	if got := n.Load(); got != 3 {
		t.Fatalf("condition called %d times, want 3", got)
	}
}

func TestWaitForFailsWithWhatAndLastMessage(t *testing.T) {
	f := &fatalTB{TB: t}
	var n int
	WaitForMsg(f, 30*time.Millisecond, "the answer", func() (bool, string) {
		n++
		return false, fmt.Sprintf("try %d", n)
	})
	if !strings.Contains(f.msg, "the answer") || !strings.Contains(f.msg, fmt.Sprintf("last: try %d", n)) {
		t.Fatalf("failure message %q lacks what or the last report (try %d)", f.msg, n)
	}
	f = &fatalTB{TB: t}
	WaitFor(f, time.Millisecond, "nothing", func() bool { return false })
	if !strings.Contains(f.msg, "waiting for nothing") || strings.Contains(f.msg, "last:") {
		t.Fatalf("failure message %q", f.msg)
	}
}

func TestPollGivesUpAfterTimeout(t *testing.T) {
	start := time.Now()
	ok, last := Poll(50*time.Millisecond, func() (bool, string) { return false, "no" })
	if ok || last != "no" {
		t.Fatalf("Poll = %v, %q; want false, \"no\"", ok, last)
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Fatalf("Poll returned after %v, before its timeout", d)
	}
}

func TestLogRecorderKeepsRecords(t *testing.T) {
	rec := NewLogRecorder()
	log := slog.New(rec)
	log.Debug("route failed", "error", "no leader")
	log.With("worker", "a").Warn("token rejected", "error", "bad token")
	log.Warn("token rejected again")
	if n := rec.Count(slog.LevelWarn, "token rejected"); n != 2 {
		t.Fatalf("Count(warn) = %d, want 2", n)
	}
	if n := rec.Count(slog.LevelDebug, "token rejected"); n != 0 {
		t.Fatalf("Count(debug) = %d, want 0", n)
	}
	if got := rec.Values("token rejected", "error"); len(got) != 1 || got[0] != "bad token" {
		t.Fatalf("Values(error) = %q", got)
	}
	if got := rec.Values("token rejected", "worker"); len(got) != 1 || got[0] != "a" {
		t.Fatalf("Values(worker) = %q: attributes from With are lost", got)
	}
	if n := len(rec.Records()); n != 3 {
		t.Fatalf("%d records, want 3", n)
	}
}

func TestProbeWaitsTimesTheTake(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	first := true
	stop := ProbeWaits(func() {
		if first {
			first = false
			entered <- struct{}{}
			<-release
		}
	})
	<-entered
	time.Sleep(10 * time.Millisecond)
	close(release)
	ws := stop()
	// The first take began before entered and ended after release.
	if len(ws) == 0 || ws[0] < 10*time.Millisecond {
		t.Fatalf("waits %v: the first should span the 10ms the take was held", ws)
	}
}

func TestRecvTakesAValueOrFailsNamingIt(t *testing.T) {
	ch := make(chan int, 1)
	ch <- 7
	if got := Recv(t, ch, time.Second, "seven"); got != 7 {
		t.Fatalf("Recv = %d, want 7", got)
	}
	f := &fatalTB{TB: t}
	if got := Recv(f, ch, 10*time.Millisecond, "an answer"); got != 0 || !strings.Contains(f.msg, "waiting for an answer") {
		t.Fatalf("Recv on an empty channel = %d, failure %q", got, f.msg)
	}
}
