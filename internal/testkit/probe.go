package testkit

import (
	"slices"
	"testing"
	"time"
)

// ProbeWaits times take (a lock taken and released at once) every 50 µs
// on its own goroutine, for benchmarks of how long some work makes a
// routing decision wait. stop ends the probe and returns the waits.
func ProbeWaits(take func()) (stop func() []time.Duration) {
	quit, probed := make(chan struct{}), make(chan []time.Duration)
	go func() {
		var ws []time.Duration
		for {
			select {
			case <-quit:
				probed <- ws
				return
			default:
			}
			start := time.Now()
			take()
			ws = append(ws, time.Since(start))
			time.Sleep(50 * time.Microsecond)
		}
	}()
	return func() []time.Duration {
		close(quit)
		return <-probed
	}
}

// ReportProbeWaits reports the 99th percentile and the largest of waits
// (from ProbeWaits, over all of b's iterations) as b's metrics
// probe-wait-p99-µs and probe-wait-max-µs. It sorts waits.
func ReportProbeWaits(b *testing.B, waits []time.Duration) {
	if len(waits) == 0 {
		return // b.Loop ran no iteration (a -benchtime of 0)
	}
	slices.Sort(waits)
	b.ReportMetric(float64(waits[len(waits)*99/100].Microseconds()), "probe-wait-p99-µs")
	b.ReportMetric(float64(waits[len(waits)-1].Microseconds()), "probe-wait-max-µs")
}
