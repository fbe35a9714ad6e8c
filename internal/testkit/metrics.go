package testkit

import dto "github.com/prometheus/client_model/go"

// SampleValue is what one sample adds to a test's total: a counter's,
// gauge's or untyped value, a histogram's or summary's sample count.
func SampleValue(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	case m.Summary != nil:
		return float64(m.Summary.GetSampleCount())
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return 0
}
