package state

import (
	"bytes"
	"io"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
	"github.com/cartrouter/cart/internal/testkit"
)

// benchFullState returns a state whose index holds n entries (paths of 100
// random blocks over 8 workers), built once per size.
func benchFullState(b *testing.B, n int) (*State, *engine.Engine) {
	b.Helper()
	dec := decider.New(decider.Options{Policy: engine.Policy{BlockChars: 64, Threshold: 0.3, BalanceAbsThreshold: 64, BalanceRelThreshold: 1.5},
		MaxEntries: n, InlineEvict: true, Rand: rand.New(rand.NewPCG(1, 2))})
	var eng *engine.Engine
	dec.Do(decider.OpRead, func(e *engine.Engine) { eng = e })
	st := New(dec)
	a := &testApplier{t: b, st: st}
	urls := []string{"http://w0", "http://w1", "http://w2", "http://w3", "http://w4", "http://w5", "http://w6", "http://w7"}
	a.apply(setWorkers(urls...))
	r := rand.New(rand.NewPCG(9, 9))
	path := make([]uint64, 100)
	for i := 0; eng.Index().Len() < n; i++ {
		for j := range path {
			path[j] = r.Uint64()
		}
		id, _ := eng.WorkerIDOf(urls[i%len(urls)])
		eng.Index().Insert(path, index.WorkerID(id), int64(i))
	}
	return st, eng
}

// BenchmarkCaptureLockHold measures how long taking a snapshot holds the
// routing lock on a full 1M-entry index: Capture is everything done under
// the lock (lock-hold-max-µs is the longest single hold seen, wall time;
// lock-hold-cpu-* the CPU time of the holding thread, which neighbours on a
// busy box do not inflate);
// writing the snapshot out happens after it returns. The write is timed
// apart (write-ms) so the total cost of a snapshot stays visible.
func BenchmarkCaptureLockHold(b *testing.B) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	st, _ := benchFullState(b, 1_000_000)
	var worst, worstCPU, cpuTotal, write time.Duration
	n := 0
	for b.Loop() {
		start, cpu := time.Now(), testkit.ThreadCPU()
		snap := st.Capture()
		hold, holdCPU := time.Since(start), testkit.ThreadCPU()-cpu
		worst, worstCPU, cpuTotal = max(worst, hold), max(worstCPU, holdCPU), cpuTotal+holdCPU
		b.StopTimer()
		ws := time.Now()
		if err := snap.Write(io.Discard); err != nil {
			b.Fatal(err)
		}
		write += time.Since(ws)
		if rel, ok := any(snap).(interface{ Release() }); ok {
			rel.Release()
		}
		n++
		b.StartTimer()
	}
	b.ReportMetric(float64(worst.Microseconds()), "lock-hold-max-µs")
	b.ReportMetric(float64(worstCPU.Microseconds()), "lock-hold-cpu-max-µs")
	b.ReportMetric(float64(cpuTotal.Microseconds())/float64(n), "lock-hold-cpu-µs")
	b.ReportMetric(float64(write.Milliseconds())/float64(n), "write-ms")
}

// BenchmarkRestoreStall measures what installing a 1M-entry snapshot costs
// routing on the node: a probe goroutine keeps taking the decider's lock
// (as a decision would) while Restore runs, and probe-wait-* is how long it
// waited (wall time: on a 2-core box the garbage collector's mark phases,
// which decoding a snapshot sets off, show in it too). Restore decodes off
// the lock and puts the entries back restoreChunk at a time; restore-ms is
// the whole call.
func BenchmarkRestoreStall(b *testing.B) {
	src, _ := benchFullState(b, 1_000_000)
	var buf bytes.Buffer
	if err := src.Capture().Write(&buf); err != nil {
		b.Fatal(err)
	}
	snapshot := buf.Bytes()
	var waits []time.Duration
	var total time.Duration
	n := 0
	for b.Loop() {
		b.StopTimer()
		dst, _ := newTestState()
		runtime.GC()
		stop := testkit.ProbeWaits(func() { dst.dec.Do(decider.OpRead, func(*engine.Engine) {}) })
		b.StartTimer()
		start := time.Now()
		if err := dst.Restore(bytes.NewReader(snapshot)); err != nil {
			b.Fatal(err)
		}
		total += time.Since(start)
		b.StopTimer()
		waits = append(waits, stop()...)
		n++
		b.StartTimer()
	}
	testkit.ReportProbeWaits(b, waits)
	b.ReportMetric(float64(total.Milliseconds())/float64(n), "restore-ms")
}
