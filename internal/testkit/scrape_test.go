package testkit

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestMetricSampleReadsOneSeries(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "# HELP x_total X.\n# TYPE x_total counter\nx_total{a=\"1\"} 3\nx_total{a=\"10\"} 7\ny 2.5\n")
	}))
	defer srv.Close()
	for _, tc := range []struct {
		series string
		want   float64
		found  bool
	}{
		{`x_total{a="1"}`, 3, true},
		{`x_total{a="10"}`, 7, true},
		{"y", 2.5, true},
		{"x_total", 0, false}, // a name alone is not one of its labelled series
		{"z", 0, false},
	} {
		v, found, err := MetricSample(nil, srv.URL, tc.series)
		if err != nil || v != tc.want || found != tc.found {
			t.Errorf("%s: %v %v %v, want %v %v", tc.series, v, found, err, tc.want, tc.found)
		}
	}
	srv.Close()
	if _, _, err := MetricSample(srv.Client(), srv.URL, "y"); err == nil {
		t.Error("no error from a closed server")
	}
}
