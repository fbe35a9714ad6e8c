package every

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestTickRepeatsAndStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var n atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		Tick(ctx, time.Millisecond, nil, func() {
			if n.Add(1) == 3 {
				cancel()
			}
		})
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Tick did not return after its context ended")
	}
	// A tick ready together with the cancel may still win the select once.
	if got := n.Load(); got < 3 || got > 4 {
		t.Fatalf("fn ran %d times, want 3 (or 4 if a tick raced the cancel)", got)
	}
}

func TestTickRunsAtOnceOnKick(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kick := make(chan struct{})
	ran := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		Tick(ctx, time.Hour, kick, func() { ran <- struct{}{} })
	}()
	kick <- struct{}{}
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("a kick did not run fn before an hour's tick")
	}
	cancel()
	<-done
}

func TestSleep(t *testing.T) {
	start := time.Now()
	if err := Sleep(context.Background(), 20*time.Millisecond); err != nil || time.Since(start) < 20*time.Millisecond {
		t.Fatalf("Sleep returned %v after %v", err, time.Since(start))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start = time.Now()
	if err := Sleep(ctx, time.Hour); err != context.Canceled || time.Since(start) > 10*time.Second {
		t.Fatalf("an ended context: %v after %v", err, time.Since(start))
	}
	if err := Sleep(ctx, 0); err != context.Canceled {
		t.Fatalf("no wait, an ended context: %v", err)
	}
	if err := Sleep(context.Background(), -time.Second); err != nil {
		t.Fatalf("no wait: %v", err)
	}
}
