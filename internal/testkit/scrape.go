package testkit

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// MetricSample fetches the Prometheus text exposition at url with client
// (nil: http.DefaultClient) and returns the value of series: a metric name
// with its labels exactly as the exposition prints them, such as
// `cart_fallback_total{cause="timeout"}`. found is false when no line
// carries that series.
func MetricSample(client *http.Client, url, series string) (v float64, found bool, err error) {
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Get(url)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, false, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if s, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			v, err := strconv.ParseFloat(s, 64)
			return v, err == nil, err
		}
	}
	return 0, false, sc.Err()
}
