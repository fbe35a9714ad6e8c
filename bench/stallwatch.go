package bench

import "time"

// A stallWatch measures how late the bench process runs a goroutine that
// waits stallPeriod at a time. The data planes under test live in this
// process: while it cannot run a goroutine, their answers wait too, and a
// call the control plane answered in time can still reach its 20 ms route
// timeout. Such a stall is the load generator's, not the product's.
type stallWatch struct {
	start  time.Time
	now    func() time.Time
	stop   chan struct{}
	done   chan struct{}
	stalls []stall
}

// stall is a wake-up at least stallMin late: at is when the wait began
// (since the watch started), late how much longer than stallPeriod it took.
type stall struct{ at, late time.Duration }

const (
	stallPeriod = time.Millisecond
	stallMin    = 10 * time.Millisecond
)

func watchStalls() *stallWatch { return watchStallsBy(time.Now) }

// watchStallsBy reads the time from now (a test's clock).
func watchStallsBy(now func() time.Time) *stallWatch {
	w := &stallWatch{start: now(), now: now, stop: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w
}

func (w *stallWatch) run() {
	defer close(w.done)
	t := time.NewTimer(stallPeriod)
	defer t.Stop()
	for {
		began := w.now()
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		if late := w.now().Sub(began) - stallPeriod; late >= stallMin {
			w.stalls = append(w.stalls, stall{at: began.Sub(w.start), late: late})
		}
		t.Reset(stallPeriod)
	}
}

// Stop ends the watch and returns its stalls.
func (w *stallWatch) Stop() []stall {
	close(w.stop)
	<-w.done
	return w.stalls
}

// summarizeFallbackWindows records in r how the run's fallbacks bunch in
// fallback windows, the bench's own stalls, and how many of the windows
// the stalls explain: a stall from a to b delays the answers of calls
// sent from a-timeout on, so a window of sends that overlaps
// [a-timeout, b] may owe its fallbacks to the bench.
func summarizeFallbackWindows(r *CPRun, samples []cpSample, stalls []stall, timeout time.Duration) {
	windows := fallbackWindows(samples)
	r.FallbackWindows = len(windows)
	for _, n := range windows {
		r.FallbackWindowMax = max(r.FallbackWindowMax, n)
	}
	r.BenchStalls = len(stalls)
	for _, s := range stalls {
		r.BenchStallMaxMs = max(r.BenchStallMaxMs, float64(s.late)/1e6)
	}
	for w := range windows {
		from, to := w*fallbackWindow, (w+1)*fallbackWindow
		for _, st := range stalls {
			if st.at-timeout < to && st.at+stallPeriod+st.late > from {
				r.FallbackWindowsInBenchStalls++
				break
			}
		}
	}
}
