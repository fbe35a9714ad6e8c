package testkit

import "time"

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
