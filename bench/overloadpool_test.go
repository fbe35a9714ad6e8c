package bench

import (
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The TTFTs written for a window are the samples of the window's own
// figures: read back, their p99 is the figures' p99.
func TestTTFTFileHoldsTheFiguresSamples(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var rs []timedResult
	for i := range 300 {
		status := http.StatusOK
		if i%50 == 7 {
			status = http.StatusTooManyRequests // refused: not a TTFT
		}
		rs = append(rs, timedResult{Result{Status: status, TTFT: time.Duration(i*37%251) * time.Millisecond}, t0.Add(time.Duration(i) * time.Second)})
	}
	l := &tenantLoad{result: rs, from: t0.Add(10 * time.Second), until: t0.Add(280 * time.Second)}
	dir := t.TempDir()
	path := filepath.Join(dir, ttftFilePrefix+"flood__cart.csv")
	if err := writeTTFTCSV(path, l.servedTTFTsMs(), l.servedTTFTsMs()[:100]); err != nil {
		t.Fatal(err)
	}
	ws, err := ReadTTFTWindows([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 1 || ws[0].Scenario != "flood" || ws[0].Target != "cart" || ws[0].Dir != dir {
		t.Fatalf("windows %+v", ws)
	}
	f := l.figures(time.Minute)
	if got, want := len(ws[0].Alone), f.Requests-f.Refused-f.Errors; got != want {
		t.Fatalf("%d TTFTs alone read back, the figures count %d served", got, want)
	}
	if got := Percentile(ws[0].Alone, 99); math.Abs(got-f.TTFTP99Ms) > 1e-3 {
		t.Fatalf("p99 of the file %v, the figures' %v", got, f.TTFTP99Ms)
	}
	if len(ws[0].Loaded) != 100 {
		t.Fatalf("%d loaded TTFTs read back, want 100", len(ws[0].Loaded))
	}
}

// Pooling takes each percentile over all windows' requests together, per
// scenario and target, and keeps each window's own ratio.
func TestPoolTTFT(t *testing.T) {
	seq := func(from, to float64) []float64 {
		var out []float64
		for v := from; v <= to; v++ {
			out = append(out, v)
		}
		return out
	}
	ws := []TTFTWindow{
		{Dir: "a", Scenario: "flood", Target: "cart", Alone: seq(1, 101), Loaded: seq(1, 501)},
		{Dir: "a", Scenario: "flood", Target: "cart-2dp", Alone: []float64{10, 10}, Loaded: []float64{20, 20}},
		{Dir: "b", Scenario: "flood", Target: "cart", Alone: seq(102, 202), Loaded: seq(502, 1002)},
	}
	p := PoolTTFT(ws)
	if len(p) != 2 || p[0].Target != "cart" || p[1].Target != "cart-2dp" {
		t.Fatalf("pooled %+v", p)
	}
	c := p[0]
	if c.Windows != 2 || c.AloneN != 202 || c.LoadedN != 1002 {
		t.Fatalf("cart pooled %d windows, %d / %d requests", c.Windows, c.AloneN, c.LoadedN)
	}
	// 1..202 and 1..1002: the p99 by linear interpolation over n values
	// is 1 + 0.99(n-1).
	if want := 1 + 0.99*201; math.Abs(c.AloneP99-want) > 1e-9 {
		t.Fatalf("pooled p99 alone %v, want %v", c.AloneP99, want)
	}
	if want := 1 + 0.99*1001; math.Abs(c.LoadedP99-want) > 1e-9 {
		t.Fatalf("pooled p99 loaded %v, want %v", c.LoadedP99, want)
	}
	if want := c.LoadedP99 / c.AloneP99; c.Ratio != want {
		t.Fatalf("ratio %v, want %v", c.Ratio, want)
	}
	if want := []float64{ws[0].Ratio(), ws[2].Ratio()}; !slices.Equal(c.WindowRatios, want) {
		t.Fatalf("window ratios %v, want %v", c.WindowRatios, want)
	}
	if p[1].Ratio != 2 || p[1].Windows != 1 {
		t.Fatalf("cart-2dp pooled %+v", p[1])
	}
	if s := FormatPooledTTFT(p); !strings.Contains(s, "| flood | cart | 2 | 202 / 1002 |") || !strings.Contains(s, "**2.00×**") {
		t.Fatalf("table:\n%s", s)
	}
}

func TestReadTTFTWindowsRefusesWhatItCannotPool(t *testing.T) {
	for name, tc := range map[string]struct{ file, body string }{
		"no files":   {"", ""},
		"header":     {"ttft__flood__cart.csv", "ttft\n1\n"},
		"phase":      {"ttft__flood__cart.csv", "phase,ttft_ms\nwarm,1\nloaded,2\n"},
		"number":     {"ttft__flood__cart.csv", "phase,ttft_ms\nalone,x\nloaded,2\n"},
		"no alone":   {"ttft__flood__cart.csv", "phase,ttft_ms\nloaded,2\n"},
		"no target":  {"ttft__flood.csv", "phase,ttft_ms\nalone,1\nloaded,2\n"},
		"empty file": {"ttft__flood__cart.csv", ""},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.file != "" {
				if err := os.WriteFile(filepath.Join(dir, tc.file), []byte(tc.body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if ws, err := ReadTTFTWindows([]string{dir}); err == nil {
				t.Fatalf("read %+v, want an error", ws)
			}
		})
	}
}

// CalmFirst gives each calm request the first end after its start that no
// earlier calm request took (nor its own end), plus the first token's time.
func TestCalmFirst(t *testing.T) {
	reqs := []ServedRequest{
		{"flood", -300, -290, 100},
		{"flood", -200, -190, 130},
		{"flood", -100, -90, 135},
		{"flood", 0, 10, 400},
		{"calm", 90, 150, 600},  // takes the end at 100
		{"calm", 95, 160, 300},  // 100 taken: 130
		{"calm", 96, 170, 131},  // 100, 130 taken, its own end (131) skipped: 135
		{"calm", -5, 20, 60},    // started before the window: no bound
		{"calm", 390, 420, 900}, // 400
		{"calm", 950, 960, 990}, // no end after it but its own: no bound
	}
	got := CalmFirst(reqs, 10)
	if want := []float64{100 - 90 + 10, 130 - 95 + 10, 135 - 96 + 10, 400 - 390 + 10}; !slices.Equal(got, want) {
		t.Fatalf("calm-first %v, want %v", got, want)
	}
}

// The requests file a window writes reads back, and pooling takes the
// calm-first floor over the windows that have one.
func TestRequestsFileReadsBackAndPools(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ok := func(endMs, e2eMs, ttftMs int) timedResult {
		return timedResult{Result{Status: http.StatusOK, E2E: time.Duration(e2eMs) * time.Millisecond, TTFT: time.Duration(ttftMs) * time.Millisecond}, at(endMs)}
	}
	flood := &tenantLoad{plan: tenantPlan{name: "flood"}, result: []timedResult{ok(100, 400, 10), ok(300, 250, 10)}}
	calm := &tenantLoad{plan: tenantPlan{name: "calm"}, result: []timedResult{ok(200, 150, 60)}}
	dir := t.TempDir()
	if err := writeRequestsCSV(filepath.Join(dir, "requests__flood__cart.csv.gz"), []*tenantLoad{flood, calm}, t0); err != nil {
		t.Fatal(err)
	}
	if err := writeTTFTCSV(filepath.Join(dir, ttftFilePrefix+"flood__cart.csv"), []float64{5, 7, 9}, []float64{60}); err != nil {
		t.Fatal(err)
	}
	ws, err := ReadTTFTWindows([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	want := []ServedRequest{{"flood", -300, -290, 100}, {"flood", 50, 60, 300}, {"calm", 50, 110, 200}}
	if len(ws) != 1 || !slices.Equal(ws[0].Requests, want) {
		t.Fatalf("requests read back %+v, want %+v", ws, want)
	}
	p := PoolTTFT(ws)
	// The calm request started at 50: the next end is 100, plus the p50
	// alone (7).
	if len(p) != 1 || p[0].CalmFirstP99 != 57 || p[0].CalmFirstRatio != 57/Percentile([]float64{5, 7, 9}, 99) {
		t.Fatalf("pooled %+v, want a calm-first p99 of 57 ms", p)
	}
	if !slices.Equal(p[0].WindowFloors, []float64{p[0].CalmFirstRatio}) || !strings.Contains(FormatPooledTTFT(p), "(floor ") {
		t.Fatalf("window floors %v, want the one window's %v, shown", p[0].WindowFloors, p[0].CalmFirstRatio)
	}
	// A window without its requests file pools no floor at all rather
	// than one from the other windows alone.
	ws = append(ws, TTFTWindow{Dir: "b", Scenario: "flood", Target: "cart", Alone: []float64{5}, Loaded: []float64{6}})
	if p := PoolTTFT(ws); p[0].CalmFirstP99 != 0 || !strings.Contains(FormatPooledTTFT(p), "no requests files") {
		t.Fatalf("pooled with a window missing its requests: %+v", p)
	}
}
