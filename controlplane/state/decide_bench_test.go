package state

import (
	"io"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
)

// holds records lock-hold (or wait+hold) durations; local to the
// benchmark, not a metric.
type holds struct {
	mu sync.Mutex
	d  []time.Duration
}

func (h *holds) add(d time.Duration) { h.mu.Lock(); h.d = append(h.d, d); h.mu.Unlock() }

func (h *holds) q(p float64) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.d) == 0 {
		return 0
	}
	s := slices.Clone(h.d)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func µs(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }

// BenchmarkDecideUnderLoad reproduces, in one process and without RPCs,
// what shares the routing lock on a control-plane node with a full
// 1M-entry index: decisions at an open-loop 2000 routes/s (prompts of one
// of 100 shared 2k-character prefixes plus a unique suffix, 2.5k-10k
// characters, as in the cluster bench), a placement batch of 20 prompts
// applied every 10 ms (a follower's load; a leader skips its own), an
// eviction pass every second in maintenance-sized steps, and either no
// snapshot or one every second (capture under the lock, then written out:
// a frozen view is then alive nearly all the time, the worst case for copy
// on write; production snapshots every 8192 log entries, about a minute at
// 100 batches/s). decide-* is the time a decision waits for and holds the
// lock (wall); *-cpu-* are CPU time of the holding thread, which a busy
// shared box does not inflate by descheduling it. Run with -benchtime 1x;
// each op lasts 5 s.
func BenchmarkDecideUnderLoad(b *testing.B) {
	const n = 1_000_000
	dec := decider.New(decider.Options{Policy: engine.Policy{BlockChars: 64, Threshold: 0.3, BalanceAbsThreshold: 64, BalanceRelThreshold: 1.5},
		MaxEntries: n, Headroom: n / 8, Rand: rand.New(rand.NewPCG(1, 2))})
	var eng *engine.Engine
	dec.Do(decider.OpRead, func(e *engine.Engine) { eng = e })
	st := New(dec)
	a := &testApplier{t: b, st: st}
	urls := []string{"http://w0", "http://w1", "http://w2", "http://w3"}
	a.apply(setWorkers(urls...))
	r := rand.New(rand.NewPCG(3, 3))
	path := make([]uint64, 100)
	for i := 0; eng.Index().Len() < n; i++ {
		for j := range path {
			path[j] = r.Uint64()
		}
		id, _ := eng.WorkerIDOf(urls[i%len(urls)])
		eng.Index().Insert(path[:min(len(path), n-eng.Index().Len())], index.WorkerID(id), int64(i))
	}
	prefixes := make([][]uint64, 100)
	for i := range prefixes {
		prefixes[i] = make([]uint64, 32) // 2k characters
		for j := range prefixes[i] {
			prefixes[i][j] = r.Uint64()
		}
	}
	for _, snapEvery := range []time.Duration{0, time.Second} {
		name := "snapshots=none"
		if snapEvery > 0 {
			name = "snapshots=every-1s"
		}
		b.Run(name, func(b *testing.B) { decideUnderLoad(b, st, eng, a, urls, prefixes, snapEvery) })
	}
}

// decideRunFor is how long each iteration routes under load.
const decideRunFor = 5 * time.Second

func decideUnderLoad(b *testing.B, st *State, eng *engine.Engine, a *testApplier, urls []string, prefixes [][]uint64, snapEvery time.Duration) {
	const (
		rate       = 2000
		n          = 1_000_000
		evictChunk = 128 // controlplane/decider maintainChunk
	)
	var decide, route, capture, evict, write holds
	// The same holds in CPU time of the holding thread (see threadCPU).
	var routeCPU, captureCPU, evictCPU holds
	var applyMax, applyCPUMax time.Duration
	for b.Loop() {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		every := func(d time.Duration, f func()) {
			wg.Go(func() {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				t := time.NewTicker(d)
				defer t.Stop()
				for {
					select {
					case <-stop:
						return
					case <-t.C:
						f()
					}
				}
			})
		}
		pr := rand.New(rand.NewPCG(5, 5))
		prompt := func() []uint64 {
			p := slices.Clone(prefixes[pr.IntN(len(prefixes))])
			for range 8 + pr.IntN(125) {
				p = append(p, pr.Uint64())
			}
			return p
		}
		// Placements for the applier, made up front: the applier must not
		// contend on the benchmark's own random source.
		var batches []*cartv1.RaftCommand
		for range 600 {
			var ps []*cartv1.Placement
			for range 20 {
				ps = append(ps, &cartv1.Placement{Worker: urls[pr.IntN(len(urls))], BlockHashes: prompt(), AtUnixNanos: time.Now().UnixNano()})
			}
			batches = append(batches, placeBatch(ps...))
		}
		bi := 0
		every(10*time.Millisecond, func() {
			if bi == len(batches) {
				return
			}
			start, cpu := time.Now(), testkit.ThreadCPU()
			a.apply(batches[bi])
			applyMax = max(applyMax, time.Since(start))
			applyCPUMax = max(applyCPUMax, testkit.ThreadCPU()-cpu)
			bi++
		})
		every(time.Second, func() {
			now := time.Now().UnixNano()
			for done := false; !done; {
				st.dec.Do(decider.OpMaintain, func(*engine.Engine) {
					start, cpu := time.Now(), testkit.ThreadCPU()
					done = eng.MaintainStep(now, n, evictChunk)
					evictCPU.add(testkit.ThreadCPU() - cpu)
					evict.add(time.Since(start))
				})
			}
		})
		snapTick := snapEvery
		if snapTick == 0 {
			snapTick = time.Hour // never within the run
		}
		every(snapTick, func() {
			start, cpu := time.Now(), testkit.ThreadCPU()
			snap := st.Capture()
			captureCPU.add(testkit.ThreadCPU() - cpu)
			capture.add(time.Since(start))
			start = time.Now()
			if err := snap.Write(io.Discard); err != nil {
				b.Error(err)
			}
			write.add(time.Since(start))
			if rel, ok := any(snap).(interface{ Release() }); ok {
				rel.Release()
			}
		})
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			start := time.Now()
			for i := 0; ; i++ {
				due := start.Add(time.Duration(i) * time.Second / rate)
				if d := time.Until(due); d > 0 {
					select {
					case <-stop:
						return
					case <-time.After(d):
					}
				} else {
					select {
					case <-stop:
						return
					default:
					}
				}
				req := engine.Request{Hashes: prompt()}
				req.KeyLen = len(req.Hashes) * 64
				t0 := time.Now()
				var t1 time.Time
				st.dec.Do(decider.OpRoute, func(*engine.Engine) {
					var cpu time.Duration
					t1, cpu = time.Now(), testkit.ThreadCPU()
					d, err := eng.Choose(req, t1.UnixNano())
					if err == nil {
						eng.Release(d.Worker)
					}
					routeCPU.add(testkit.ThreadCPU() - cpu)
				})
				t2 := time.Now()
				decide.add(t2.Sub(t0))
				route.add(t2.Sub(t1))
			}
		})
		time.Sleep(decideRunFor)
		close(stop)
		wg.Wait()
	}
	for _, m := range []struct {
		d    time.Duration
		name string
	}{
		{decide.q(0.5), "decide-p50-µs"},
		{decide.q(0.99), "decide-p99-µs"},
		{decide.q(0.999), "decide-p999-µs"},
		{decide.q(1), "decide-max-µs"},
		{route.q(0.99), "route-hold-p99-µs"},
		{capture.q(1), "capture-hold-max-µs"},
		{evict.q(1), "evict-step-max-µs"},
		{write.q(0.5), "snapshot-write-p50-µs"},
		{applyMax, "batch-apply-total-max-µs"},
		{routeCPU.q(0.99), "route-hold-cpu-p99-µs"},
		{routeCPU.q(1), "route-hold-cpu-max-µs"},
		{captureCPU.q(1), "capture-hold-cpu-max-µs"},
		{evictCPU.q(0.99), "evict-step-cpu-p99-µs"},
		{evictCPU.q(1), "evict-step-cpu-max-µs"},
		{routeCPU.q(0.999), "route-hold-cpu-p999-µs"},
		{applyCPUMax, "batch-apply-total-cpu-max-µs"},
	} {
		b.ReportMetric(µs(m.d), m.name)
	}
	b.ReportMetric(float64(len(decide.d))/decideRunFor.Seconds()/float64(b.N), "routes/s")
	b.ReportMetric(0, "ns/op")
}
