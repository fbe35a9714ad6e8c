package server_test

import (
	"net/http"
	"testing"

	"github.com/cartrouter/cart/internal/testkit"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape fetches GET /metrics over HTTP and parses the exposition format.
func scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return mfs
}

// sample sums the samples of family name whose labels include all of want
// (counter and gauge values; histogram sample counts). found is false when
// no sample matched.
func sample(mfs map[string]*dto.MetricFamily, name string, want map[string]string) (total float64, found bool) {
	mf, ok := mfs[name]
	if !ok {
		return 0, false
	}
	for _, m := range mf.GetMetric() {
		if !hasLabels(m, want) {
			continue
		}
		found = true
		total += testkit.SampleValue(m)
	}
	return total, found
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	for k, v := range want {
		ok := false
		for _, l := range m.GetLabel() {
			if l.GetName() == k && l.GetValue() == v {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// histSum returns a histogram family's sample sum over matching series.
func histSum(mfs map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	total := 0.0
	if mf, ok := mfs[name]; ok {
		for _, m := range mf.GetMetric() {
			if hasLabels(m, want) && m.Histogram != nil {
				total += m.Histogram.GetSampleSum()
			}
		}
	}
	return total
}

type labels = map[string]string
