package bench

import (
	"net/http"
	"slices"
	"testing"
	"time"
)

// nextEnds measures, per calm request, the wait for the next other request
// to end after it started: ends before its start, its own end and answers
// outside the window do not count.
func TestNextEnds(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ok := func(endMs, e2eMs int) timedResult {
		return timedResult{Result{Status: http.StatusOK, E2E: time.Duration(e2eMs) * time.Millisecond}, at(endMs)}
	}
	refused := timedResult{Result{Status: http.StatusTooManyRequests, E2E: time.Millisecond}, at(360)}
	flood := &tenantLoad{result: []timedResult{ok(90, 300), ok(130, 300), refused, ok(400, 300), ok(1000, 300)}}
	calm := &tenantLoad{result: []timedResult{
		ok(200, 100), // started at 100: the next end is at 130
		ok(500, 150), // started at 350: a refusal's end (360) and its own (500) are not the next; 400 is
		refused,      // not served
		ok(2000, 10), // outside the window
	}}
	got := nextEnds(calm, []*tenantLoad{flood, calm}, at(0), at(1500))
	if want := []calmWait{{100, 0, 30}, {350, 0, 50}}; !slices.Equal(got, want) {
		t.Fatalf("next ends %v, want %v", got, want)
	}
}
