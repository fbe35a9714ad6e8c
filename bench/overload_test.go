package bench

import (
	"math"
	"net/http"
	"slices"
	"testing"
	"time"
)

// nextEnds measures, per calm request, the wait for the next other request
// to end after it started (ends before its start, its own end and answers
// outside the window do not count) and the other requests whose first token
// came strictly between its start and its own first token.
func TestNextEnds(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ok := func(endMs, e2eMs, ttftMs int) timedResult {
		return timedResult{Result{Status: http.StatusOK, E2E: time.Duration(e2eMs) * time.Millisecond, TTFT: time.Duration(ttftMs) * time.Millisecond}, at(endMs)}
	}
	refused := timedResult{Result{Status: http.StatusTooManyRequests, E2E: time.Millisecond}, at(360)}
	flood := &tenantLoad{result: []timedResult{
		ok(90, 300, 10), ok(130, 300, 10), refused,
		ok(400, 300, 20), // first token at 120, inside the first calm request's wait
		ok(900, 600, 50), // first token at 350, when the second calm request starts: not inside
		ok(1000, 300, 10),
	}}
	calm := &tenantLoad{result: []timedResult{
		ok(200, 100, 50),  // started at 100, first token at 150: the next end is at 130
		ok(500, 150, 100), // started at 350: a refusal's end (360) and its own (500) are not the next; 400 is
		refused,           // not served
		ok(2000, 10, 5),   // outside the window
	}}
	got := nextEnds(calm, []*tenantLoad{flood, calm}, at(0), at(1500))
	if want := []calmWait{{100, 50, 30, 1}, {350, 100, 50, 0}}; !slices.Equal(got, want) {
		t.Fatalf("next ends %v, want %v", got, want)
	}
}

// engineQueue counts the window's admissions and those that waited past
// the first (1 ms) bucket, from two scrapes of the summed histogram.
func TestEngineQueue(t *testing.T) {
	bounds := []float64{0.001, 0.01, 0.1, math.Inf(1)}
	before := &Histogram{Bounds: bounds, Counts: []float64{10, 10, 11, 11}, Count: 11, Sum: 0.05}
	after := &Histogram{Bounds: bounds, Counts: []float64{40, 41, 43, 43}, Count: 43, Sum: 0.25}
	got := engineQueue(before, after)
	if got.Admitted != 32 || got.Waited != 2 || math.Abs(got.WaitSumMs-200) > 1e-9 || got.WaitMaxMs != 100 {
		t.Fatalf("engine queue %+v, want 32 admitted, 2 waited, 200 ms in all, the longest at most 100 ms", got)
	}
	after.Counts[3], after.Count = 44, 44
	if got := engineQueue(before, after); got.WaitMaxMs != -1 || got.Waited != 3 {
		t.Fatalf("a wait past the last bound: %+v, want max -1 and 3 waited", got)
	}
	if got := engineQueue(before, nil); got != (EngineQueue{}) {
		t.Fatalf("no scrape after: %+v, want nothing", got)
	}
}
