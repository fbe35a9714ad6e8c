package testkit

import (
	"testing"
	"time"
)

func TestReportProbeWaitsReportsP99AndMax(t *testing.T) {
	waits := make([]time.Duration, 0, 200)
	for i := 200; i > 0; i-- { // unsorted: ReportProbeWaits sorts
		waits = append(waits, time.Duration(i)*time.Microsecond)
	}
	r := testing.Benchmark(func(b *testing.B) {
		for b.Loop() {
		}
		ReportProbeWaits(b, waits)
	})
	if p99, max := r.Extra["probe-wait-p99-µs"], r.Extra["probe-wait-max-µs"]; p99 != 199 || max != 200 {
		t.Fatalf("p99 %v max %v, want 199 and 200", p99, max)
	}
}
