package every

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestGatePassesOncePerPeriod(t *testing.T) {
	var g Gate
	t0 := time.Unix(1000, 0)
	for _, c := range []struct {
		at   time.Duration
		want bool
	}{
		{0, true},                   // the first call passes
		{time.Second, false},        // within the period
		{10*time.Second - 1, false}, // just before it ends
		{10 * time.Second, true},    // a new period
		{15 * time.Second, false},   // periods run from the last pass
		{20*time.Second + 1, true},
	} {
		if got := g.Allow(t0.Add(c.at), 10*time.Second); got != c.want {
			t.Errorf("Allow at +%v = %v, want %v", c.at, got, c.want)
		}
	}
}

func TestGateLetsOneOfConcurrentCallersThrough(t *testing.T) {
	var g Gate
	now := time.Unix(1000, 0)
	var passed atomic.Int32
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if g.Allow(now, time.Minute) {
				passed.Add(1)
			}
		}()
	}
	wg.Wait()
	if n := passed.Load(); n != 1 {
		t.Fatalf("%d callers passed, want 1", n)
	}
}
