package testkit

import (
	"testing"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
)

func TestSampleValueOfEachKind(t *testing.T) {
	for _, tc := range []struct {
		m    *dto.Metric
		want float64
	}{
		{&dto.Metric{Counter: &dto.Counter{Value: proto.Float64(3)}}, 3},
		{&dto.Metric{Gauge: &dto.Gauge{Value: proto.Float64(-2)}}, -2},
		{&dto.Metric{Histogram: &dto.Histogram{SampleCount: proto.Uint64(5), SampleSum: proto.Float64(9)}}, 5},
		{&dto.Metric{Summary: &dto.Summary{SampleCount: proto.Uint64(4)}}, 4},
		{&dto.Metric{Untyped: &dto.Untyped{Value: proto.Float64(7)}}, 7},
		{&dto.Metric{}, 0},
	} {
		if got := SampleValue(tc.m); got != tc.want {
			t.Errorf("SampleValue(%v) = %v, want %v", tc.m, got, tc.want)
		}
	}
}
