package proxy_test

import (
	"strings"
	"testing"

	"github.com/cartrouter/cart/internal/testkit"
	dto "github.com/prometheus/client_model/go"
)

// counterValue sums the samples of a counter or gauge whose label set
// contains labelSubstr (e.g. `reason="cache_hit"`; "" matches all).
func counterValue(t *testing.T, r *rig, name, labelSubstr string) float64 {
	t.Helper()
	mfs, err := r.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if labelSubstr != "" && !strings.Contains(labelString(m), labelSubstr) {
				continue
			}
			total += testkit.SampleValue(m)
		}
	}
	return total
}

func labelString(m *dto.Metric) string {
	var sb strings.Builder
	for _, l := range m.GetLabel() {
		sb.WriteString(l.GetName() + "=\"" + l.GetValue() + "\",")
	}
	return sb.String()
}
