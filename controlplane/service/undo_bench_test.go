package service

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/raftnode"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
)

// undoBench is a leader whose one window holds 10,000 decisions of 40 new
// blocks each (400,000 blocks: about what 2 s of a stalled proposal
// queue at 5,000 routes/s).
func undoBench(b *testing.B) *testCP {
	const decisions, blocks = 10_000, 40
	// One window for all of them: no early flush at PlacementMax.
	cp := newTestCP(b, cpConfig{leader: true, opts: func(o *Options) { o.PlacementBatch, o.PlacementMax = time.Hour, 1<<30 }})
	cp.addWorkers(b, w1, w2)
	ctx := context.Background()
	for i := range decisions {
		if _, err := cp.core.decide(ctx, &cartv1.RouteRequest{Model: "m", Text: text(blocks*testBlockChars, 100_000+i), DataplaneId: "dp1"}, nil, nil); err != nil {
			b.Fatal(err)
		}
	}
	if st := cp.core.dec.Stats(); st.IndexEntries != decisions*blocks {
		b.Fatalf("%d index entries before the undo, want %d", st.IndexEntries, decisions*blocks)
	}
	return cp
}

func wantEmptyIndex(b *testing.B, cp *testCP) {
	if n := cp.core.dec.Stats().IndexEntries; n != 0 {
		b.Fatalf("%d index entries left after the undo", n)
	}
}

// BenchmarkFailedBatchUndoStall measures what undoing a large window that
// failed to commit costs routing: "probe" is the wall-clock wait of a
// probe taking the lock every 50 µs while the window's flush fails and is
// undone; "step" is the CPU time of each lock hold of the undo (the wall
// clock of a hold also counts the time the OS gives other processes).
//
//	go test -run '^$' -bench FailedBatchUndoStall -benchtime 3x ./controlplane/service/
func BenchmarkFailedBatchUndoStall(b *testing.B) {
	b.Run("probe", func(b *testing.B) {
		var waits []time.Duration
		var total time.Duration
		n := 0
		for b.Loop() {
			b.StopTimer()
			cp := undoBench(b)
			cp.node.setApplyErr(raftnode.ErrNotLeader)
			stop := testkit.ProbeWaits(func() { cp.core.dec.Do(decider.OpRead, func(*engine.Engine) {}) })
			b.StartTimer()
			start := time.Now()
			cp.flushBatch()
			total += time.Since(start)
			b.StopTimer()
			waits = append(waits, stop()...)
			wantEmptyIndex(b, cp)
			n++
			b.StartTimer()
		}
		testkit.ReportProbeWaits(b, waits)
		b.ReportMetric(float64(total.Milliseconds())/float64(n), "undo-ms")
	})
	b.Run("step", func(b *testing.B) {
		var cpu []time.Duration
		for b.Loop() {
			b.StopTimer()
			cp := undoBench(b)
			bt := cp.core.batch
			cp.core.dec.Do(decider.OpLedger, func(eng *engine.Engine) {
				batch, origins, _ := bt.take(eng)
				bt.settle(eng, batch, origins, 0, 0, errors.New("not committed"))
			})
			b.StartTimer()
			runtime.LockOSThread() // ThreadCPU reads this thread's clock
			for more := true; more; {
				cp.core.dec.Do(decider.OpLedger, func(eng *engine.Engine) {
					c := testkit.ThreadCPU()
					_, more = bt.undoStep(eng, undoChunk)
					cpu = append(cpu, testkit.ThreadCPU()-c)
				})
			}
			runtime.UnlockOSThread()
			b.StopTimer()
			wantEmptyIndex(b, cp)
			b.StartTimer()
		}
		slices.Sort(cpu)
		b.ReportMetric(float64(len(cpu))/float64(b.N), "steps")
		b.ReportMetric(float64(cpu[len(cpu)/2].Microseconds()), "step-cpu-p50-µs")
		b.ReportMetric(float64(cpu[len(cpu)*99/100].Microseconds()), "step-cpu-p99-µs")
		b.ReportMetric(float64(cpu[len(cpu)-1].Microseconds()), "step-cpu-max-µs")
	})
}
