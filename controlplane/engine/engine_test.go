package engine

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/cartrouter/cart/controlplane/index"
)

func TestNewPanicsWithoutBlockChars(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("New accepted BlockChars 0")
		}
	}()
	New(Policy{}, index.New(index.Options{}), rand.New(rand.NewPCG(1, 1)))
}

func TestAccessors(t *testing.T) {
	pol := testPolicy()
	e := newTestEngine(t, pol, WorkerSpec{URL: "a", MaxLoad: 3, LoadPenalty: 1}, WorkerSpec{URL: "b"})
	if e.Policy() != pol || e.Index() == nil {
		t.Error("Policy/Index accessors")
	}
	setLoad(t, e, "a", 2)
	e.SetHealthy("b", false)
	want := []WorkerState{
		{WorkerSpec: WorkerSpec{URL: "a", MaxLoad: 3, LoadPenalty: 1}, Healthy: true, Load: 2},
		{WorkerSpec: WorkerSpec{URL: "b"}, Healthy: false, Load: 0},
	}
	if got := e.Workers(); !slices.Equal(got, want) {
		t.Errorf("Workers() = %+v, want %+v", got, want)
	}
	if e.Load("a") != 2 || e.Load("nope") != 0 {
		t.Error("Load")
	}
	e.SetHealthy("nope", false) // unknown: ignored
	d := Decision{Worker: "a", Reason: ReasonCacheHit, MatchedChars: 50, MatchedRatio: 0.5}
	if got := d.String(); got != "cache_hit -> a (matched 50 chars, 0.50)" {
		t.Errorf("String() = %q", got)
	}
}

func TestRouteReasons(t *testing.T) {
	text := textOf(100, 0)
	e := newTestEngine(t, testPolicy(), urls("a", "b")...)

	// Empty text: least loaded, no placement.
	for _, r := range []Request{{}, {KeyLen: 5}, {Hashes: req(text).Hashes}} {
		d, err := e.Choose(r, 1)
		if err != nil || d.Reason != ReasonEmptyText || d.Placed != nil || d.Candidate != "" || d.MatchedChars != 0 {
			t.Fatalf("empty text %+v: %+v %v", r, d, err)
		}
		if e.idx.Len() != 0 {
			t.Fatalf("empty text placed %d entries", e.idx.Len())
		}
		e.Release(d.Worker)
	}

	// Miss on an empty index: least loaded (b), prefix recorded.
	setLoad(t, e, "a", 1)
	r := req(text)
	d, err := e.Choose(r, 2)
	if err != nil || d.Reason != ReasonCacheMiss || d.Worker != "b" || d.Candidate != "" || d.MatchedChars != 0 {
		t.Fatalf("miss: %+v %v", d, err)
	}
	if !slices.Equal(d.Placed, r.Hashes) || holds(t, e, "b", text) != 10 {
		t.Fatalf("miss did not record the prefix: placed %d, held %d", len(d.Placed), holds(t, e, "b", text))
	}

	// Hit: b holds it; b (load 1) is no longer strictly least loaded
	// against a (load 1) but within balance.
	d, err = e.Choose(r, 3)
	if err != nil || d.Reason != ReasonCacheHit || d.Worker != "b" || d.Candidate != "b" ||
		d.MatchedChars != 100 || d.MatchedRatio != 1 || d.Placed != nil {
		t.Fatalf("hit: %+v %v", d, err)
	}

	// Overloaded: b at 2 plus 2 more vs a at 1 -> 4-1 > 2 and 4 > 1.5.
	setLoad(t, e, "b", 2)
	d, err = e.Choose(r, 4)
	if err != nil || d.Reason != ReasonHitOverloaded || d.Worker != "a" || d.Candidate != "b" ||
		d.MatchedChars != 100 || !slices.Equal(d.Placed, r.Hashes) {
		t.Fatalf("overloaded: %+v %v (%s)", d, err, loads(e))
	}
	if e.Load("a") != 2 || e.Load("b") != 4 {
		t.Errorf("loads %s", loads(e))
	}
}

// place k blocks of a 100-char text on "a", make "b" the least loaded, and
// route the full text: cache_hit goes to a, cache_miss to b.
func TestMatchThresholdEdges(t *testing.T) {
	tests := []struct {
		name      string
		threshold float64
		abs       int
		keyLen    int
		blocks    int // blocks of the text held by a
		want      Reason
		matched   int
	}{
		{"ratio equals threshold", 0.5, 0, 100, 5, ReasonCacheHit, 50},
		{"ratio just below", 0.5, 0, 100, 4, ReasonCacheMiss, 40},
		{"threshold just above ratio", 0.5000001, 0, 100, 5, ReasonCacheMiss, 50},
		{"threshold just below ratio", 0.4999999, 0, 100, 5, ReasonCacheHit, 50},
		{"inexact decimal ratio equals threshold", 0.3, 0, 100, 3, ReasonCacheHit, 30},
		{"inexact decimal ratio equals threshold 0.7", 0.7, 0, 100, 7, ReasonCacheHit, 70},
		{"full match with partial last block", 1, 0, 95, 10, ReasonCacheHit, 95},
		{"all but the partial last block", 1, 0, 95, 9, ReasonCacheMiss, 90},
		{"abs exactly met", 0.9, 40, 100, 4, ReasonCacheHit, 40},
		{"abs just missed", 0.9, 41, 100, 4, ReasonCacheMiss, 40},
		{"abs just exceeded", 0.9, 39, 100, 4, ReasonCacheHit, 40},
		{"abs 0 disables the absolute rule", 0.9, 0, 100, 8, ReasonCacheMiss, 80},
		{"threshold 0: any match hits", 0, 0, 100, 1, ReasonCacheHit, 10},
		{"threshold 0: no match misses", 0, 0, 100, 0, ReasonCacheMiss, 0},
		{"threshold above 1 with abs", 1.5, 100, 100, 10, ReasonCacheHit, 100},
		{"threshold above 1 without abs", 1.5, 0, 100, 10, ReasonCacheMiss, 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pol := testPolicy()
			pol.Threshold, pol.MatchAbsThreshold = tt.threshold, tt.abs
			pol.BalanceAbsThreshold = 10 // never overloaded here
			e := newTestEngine(t, pol, urls("a", "b")...)
			text := textOf(tt.keyLen, 0)
			if tt.blocks > 0 {
				place(t, e, "a", text[:min(tt.blocks*testBC, tt.keyLen)])
			}
			setLoad(t, e, "a", 1)
			d, err := e.Choose(req(text), 5)
			if err != nil {
				t.Fatal(err)
			}
			wantWorker, wantCand := "b", ""
			if tt.want == ReasonCacheHit {
				wantWorker, wantCand = "a", "a"
			}
			if d.Reason != tt.want || d.Worker != wantWorker || d.Candidate != wantCand || d.MatchedChars != tt.matched {
				t.Errorf("got %+v, want %s to %s with %d chars", d, tt.want, wantWorker, tt.matched)
			}
			if wantRatio := float64(tt.matched) / float64(tt.keyLen); d.MatchedRatio != wantRatio {
				t.Errorf("ratio %v want %v", d.MatchedRatio, wantRatio)
			}
		})
	}
}

// C = "c" holds the text, L = "l" is the least loaded.
func TestBalanceEdges(t *testing.T) {
	tests := []struct {
		name               string
		abs                int
		rel                float64
		loadC, loadL       int
		penaltyC, penaltyL int
		want               Reason
	}{
		{"difference equals abs", 2, 1.5, 2, 0, 0, 0, ReasonCacheHit},
		{"difference above abs", 2, 1.5, 3, 0, 0, 0, ReasonHitOverloaded},
		{"difference above abs, rel exactly met", 0, 2, 4, 2, 0, 0, ReasonCacheHit},
		{"both strictly exceeded", 0, 2, 5, 2, 0, 0, ReasonHitOverloaded},
		{"only abs exceeded", 1, 3, 4, 2, 0, 0, ReasonCacheHit},
		{"only rel exceeded", 5, 1.5, 4, 1, 0, 0, ReasonCacheHit},
		{"neither", 5, 5, 2, 1, 0, 0, ReasonCacheHit},
		{"equal load", 0, 0, 1, 1, 0, 0, ReasonCacheHit},
		{"L idle, rel irrelevant", 0, 100, 1, 0, 0, 0, ReasonHitOverloaded},
		{"fractional rel", 0, 1.25, 5, 4, 0, 0, ReasonCacheHit}, // 5 > 5.0 is false
		{"fractional rel exceeded", 0, 1.2, 5, 4, 0, 0, ReasonHitOverloaded},
		{"penalty on C pushes it over", 2, 1.5, 0, 0, 3, 0, ReasonHitOverloaded},
		{"penalty on C exactly at abs", 2, 1.5, 0, 0, 2, 0, ReasonCacheHit},
		{"penalty on C plus load", 2, 1.5, 1, 0, 2, 0, ReasonHitOverloaded},
		{"penalty on L closes the gap", 2, 1.5, 4, 0, 0, 2, ReasonCacheHit},
		{"same without penalty on L", 2, 1.5, 4, 0, 0, 0, ReasonHitOverloaded},
		{"penalty on L in the rel rule", 0, 2, 5, 2, 0, 1, ReasonCacheHit}, // 5 > 2*(2+1) is false
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pol := testPolicy()
			pol.BalanceAbsThreshold, pol.BalanceRelThreshold = tt.abs, tt.rel
			e := newTestEngine(t, pol,
				WorkerSpec{URL: "c", LoadPenalty: tt.penaltyC},
				WorkerSpec{URL: "l", LoadPenalty: tt.penaltyL})
			text := textOf(100, 0)
			place(t, e, "c", text)
			setLoad(t, e, "c", tt.loadC)
			setLoad(t, e, "l", tt.loadL)
			r := req(text)
			d, err := e.Choose(r, 5)
			if err != nil {
				t.Fatal(err)
			}
			if d.Reason != tt.want || d.Candidate != "c" {
				t.Fatalf("got %+v (%s), want %s", d, loads(e), tt.want)
			}
			switch d.Reason {
			case ReasonCacheHit:
				if d.Worker != "c" || d.Placed != nil {
					t.Errorf("hit: %+v", d)
				}
			case ReasonHitOverloaded:
				// L wins and becomes a second holder of the prefix.
				if d.Worker != "l" || !slices.Equal(d.Placed, r.Hashes) {
					t.Errorf("overloaded: %+v", d)
				}
				if holds(t, e, "l", text) != 10 || holds(t, e, "c", text) != 10 {
					t.Errorf("holders after hit_overloaded: l=%d c=%d", holds(t, e, "l", text), holds(t, e, "c", text))
				}
			}
		})
	}
}

func TestLeastLoadedUsesPenalty(t *testing.T) {
	e := newTestEngine(t, testPolicy(),
		WorkerSpec{URL: "a", LoadPenalty: 2},
		WorkerSpec{URL: "b"},
		WorkerSpec{URL: "c"})
	setLoad(t, e, "b", 1)
	setLoad(t, e, "c", 3)
	// effective: a=2, b=1, c=3
	for i := range 5 {
		d, err := e.Choose(req(textOf(30, byte(i))), 1)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 && d.Worker != "b" {
			t.Fatalf("first route went to %s (%s)", d.Worker, loads(e))
		}
		e.Release(d.Worker)
	}
	// b=1 a=2: after b takes one more (2) it ties with a.
	setLoad(t, e, "b", 1)
	seen := map[string]int{}
	for i := range 200 {
		d, _ := e.Choose(Request{DryRun: true}, int64(i))
		seen[d.Worker]++
	}
	if seen["c"] != 0 || seen["a"] < 60 || seen["b"] < 60 {
		t.Errorf("tie between a (penalty) and b (load): %v", seen)
	}
}

func TestMaxLoad(t *testing.T) {
	e := newTestEngine(t, testPolicy(),
		WorkerSpec{URL: "a", MaxLoad: 1},
		WorkerSpec{URL: "b", MaxLoad: 2})
	text := textOf(50, 0)
	place(t, e, "a", text)
	d, err := e.Choose(req(text), 1)
	if err != nil || d.Worker != "a" || d.Reason != ReasonCacheHit {
		t.Fatalf("%+v %v", d, err)
	}
	// a is saturated: not a candidate even though it holds the prefix,
	// and not usable as least loaded.
	d, err = e.Choose(req(text), 2)
	if err != nil || d.Worker != "b" || d.Reason != ReasonCacheMiss || d.Candidate != "" {
		t.Fatalf("%+v %v", d, err)
	}
	d, err = e.Choose(req(text), 3) // b now holds it too
	if err != nil || d.Worker != "b" || d.Reason != ReasonCacheHit {
		t.Fatalf("%+v %v", d, err)
	}
	before := loads(e)
	if _, err := e.Choose(req(text), 4); !errors.Is(err, ErrAllSaturated) {
		t.Fatalf("err %v, want ErrAllSaturated", err)
	}
	if _, err := e.Choose(Request{DryRun: true}, 4); !errors.Is(err, ErrAllSaturated) {
		t.Fatalf("dry run err %v, want ErrAllSaturated", err)
	}
	if loads(e) != before {
		t.Errorf("failed route changed loads: %s -> %s", before, loads(e))
	}
	e.Release("a")
	if d, err := e.Choose(Request{}, 5); err != nil || d.Worker != "a" {
		t.Fatalf("after release: %+v %v", d, err)
	}
	// Load at max_load-1 is still usable; MaxLoad 0 never saturates.
	e2 := newTestEngine(t, testPolicy(), WorkerSpec{URL: "z"})
	setLoad(t, e2, "z", 1000)
}

func TestErrors(t *testing.T) {
	tests := []struct {
		name      string
		specs     []WorkerSpec
		unhealthy []string
		load      map[string]int
		exclude   []string
		want      error
	}{
		{"no workers", nil, nil, nil, nil, ErrNoWorkers},
		{"all unhealthy", urls("a", "b"), []string{"a", "b"}, nil, nil, ErrNoHealthy},
		{"unhealthy and excluded", urls("a", "b"), []string{"a", "b"}, nil, []string{"a"}, ErrNoHealthy},
		{"all excluded", urls("a", "b"), nil, nil, []string{"b", "a"}, ErrAllExcluded},
		{"healthy ones excluded", urls("a", "b"), []string{"a"}, nil, []string{"b"}, ErrAllExcluded},
		{"all saturated", []WorkerSpec{{URL: "a", MaxLoad: 1}, {URL: "b", MaxLoad: 2}},
			nil, map[string]int{"a": 1, "b": 2}, nil, ErrAllSaturated},
		{"excluded and saturated", []WorkerSpec{{URL: "a", MaxLoad: 1}, {URL: "b"}},
			nil, map[string]int{"a": 1}, []string{"b"}, ErrAllSaturated},
		{"unhealthy and saturated", []WorkerSpec{{URL: "a", MaxLoad: 1}, {URL: "b"}},
			[]string{"b"}, map[string]int{"a": 1}, nil, ErrAllSaturated},
		{"unknown exclude is harmless", urls("a"), nil, nil, []string{"zzz"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := engineIn(t, tt.specs, tt.load, tt.unhealthy)
			before := loads(e)
			for _, dry := range []bool{true, false} {
				r := req(textOf(40, 0))
				r.Exclude, r.DryRun = tt.exclude, dry
				d, err := e.Choose(r, 1)
				if !errors.Is(err, tt.want) {
					t.Fatalf("dry=%v: err %v, want %v", dry, err, tt.want)
				}
				if err != nil {
					if d.Worker != "" || d.Placed != nil {
						t.Errorf("decision returned with error: %+v", d)
					}
					if loads(e) != before || e.idx.Len() != 0 {
						t.Errorf("failed route changed state")
					}
				}
			}
		})
	}
	// Every error is distinct.
	errs := []error{ErrNoWorkers, ErrNoHealthy, ErrAllExcluded, ErrAllSaturated}
	for i, a := range errs {
		for j, b := range errs {
			if (i == j) != errors.Is(a, b) {
				t.Errorf("errors %d and %d", i, j)
			}
		}
	}
}

func TestUnhealthyExcluded(t *testing.T) {
	e := newTestEngine(t, testPolicy(), urls("a", "b")...)
	text := textOf(60, 0)
	place(t, e, "a", text)
	e.SetHealthy("a", false)
	for i := range 3 {
		d, err := e.Choose(req(text), int64(i))
		if err != nil || d.Worker != "b" {
			t.Fatalf("route %d: %+v %v", i, d, err)
		}
		if i == 0 && (d.Reason != ReasonCacheMiss || d.Candidate != "") {
			t.Fatalf("unhealthy holder considered: %+v", d)
		}
		e.Release("b")
	}
	e.SetHealthy("a", true)
	e.SetHealthy("b", false)
	d, err := e.Choose(req(text), 9)
	if err != nil || d.Worker != "a" || d.Reason != ReasonCacheHit {
		t.Fatalf("back to healthy: %+v %v", d, err)
	}
}

func TestExclude(t *testing.T) {
	e := newTestEngine(t, testPolicy(), urls("a", "b", "c")...)
	text := textOf(60, 0)
	place(t, e, "a", text[:20])
	place(t, e, "b", text)
	setLoad(t, e, "a", 1)
	setLoad(t, e, "b", 1)
	// b is the best candidate; excluded, a (shorter match, 20/60 < 0.5)
	// is the next candidate but not good enough: miss to c.
	r := req(text)
	r.Exclude = []string{"b"}
	d, err := e.Choose(r, 1)
	if err != nil || d.Worker != "c" || d.Reason != ReasonCacheMiss || d.MatchedChars != 20 {
		t.Fatalf("%+v %v", d, err)
	}
	e.Release("c")
	e.Unplace(d) // c must not hold the text for the next step
	// With the threshold lowered, the next candidate a wins.
	e.pol.Threshold = 0.3
	d, err = e.Choose(r, 2)
	if err != nil || d.Worker != "a" || d.Reason != ReasonCacheHit || d.Candidate != "a" {
		t.Fatalf("%+v %v", d, err)
	}
	e.Release("a")
	// Excluding the least loaded worker (c, idle) on a miss.
	for i := range 20 {
		r := req(textOf(60, byte(5+i)))
		r.Exclude, r.DryRun = []string{"c"}, true
		d, err = e.Choose(r, 3)
		if err != nil || d.Worker == "c" || d.Reason != ReasonCacheMiss {
			t.Fatalf("%+v %v", d, err)
		}
	}
}

func TestCandidateTieBrokenByLoad(t *testing.T) {
	for _, lighter := range []string{"a", "b"} {
		e := newTestEngine(t, testPolicy(), urls("a", "b", "c")...)
		text := textOf(80, 0)
		place(t, e, "a", text)
		place(t, e, "b", text)
		heavier := map[string]string{"a": "b", "b": "a"}[lighter]
		setLoad(t, e, heavier, 1)
		setLoad(t, e, lighter, 1)
		setLoad(t, e, heavier, 1) // heavier=2, lighter=1, c=0
		d, err := e.Choose(req(text), 1)
		if err != nil || d.Worker != lighter || d.Reason != ReasonCacheHit {
			t.Errorf("lighter=%s: %+v %v", lighter, d, err)
		}
	}
}

func TestLongerMatchWins(t *testing.T) {
	pol := testPolicy()
	pol.Threshold = 0.2
	e := newTestEngine(t, pol, urls("a", "b", "c")...)
	text := textOf(100, 0)
	place(t, e, "a", text[:30])
	place(t, e, "b", text[:80])
	setLoad(t, e, "b", 2) // busier than a (0) and c (0), within balance
	d, err := e.Choose(req(text), 1)
	if err != nil || d.Worker != "b" || d.Reason != ReasonCacheHit || d.MatchedChars != 80 {
		t.Fatalf("%+v %v", d, err)
	}
	// b gets the rest of the path; only the two new blocks are placed.
	if len(d.Placed) != 2 || holds(t, e, "b", text) != 10 || holds(t, e, "a", text) != 3 {
		t.Errorf("placed %d, b holds %d, a holds %d", len(d.Placed), holds(t, e, "b", text), holds(t, e, "a", text))
	}
}

func TestMissRecordsPrefixForNextRequest(t *testing.T) {
	e := newTestEngine(t, testPolicy(), urls("a", "b", "c", "d")...)
	first := textOf(200, 0)
	d1, err := e.Choose(req(first), 1)
	if err != nil || d1.Reason != ReasonCacheMiss {
		t.Fatal(d1, err)
	}
	// A follow-up that extends the prompt (same first 200 chars) follows
	// it even though other workers are now less loaded.
	next := first + textOf(50, 3)
	d2, err := e.Choose(req(next), 2)
	if err != nil || d2.Reason != ReasonCacheHit || d2.Worker != d1.Worker || d2.MatchedChars != 200 {
		t.Fatalf("follow-up: %+v %v (first went to %s)", d2, err, d1.Worker)
	}
	if len(d2.Placed) != 5 {
		t.Errorf("follow-up placed %d blocks, want the 5 new ones", len(d2.Placed))
	}
}

func TestDryRun(t *testing.T) {
	e := newTestEngine(t, testPolicy(), urls("a", "b")...)
	text := textOf(100, 0)
	place(t, e, "a", text[:60])
	setLoad(t, e, "b", 1)
	idxBefore, loadBefore := snapshot(e), loads(e)
	for i, r := range []Request{req(text), req(textOf(100, 5)), {}} {
		r.DryRun = true
		d, err := e.Choose(r, int64(100+i))
		if err != nil {
			t.Fatal(err)
		}
		if d.Placed != nil {
			t.Errorf("dry run placed %d hashes", len(d.Placed))
		}
		if i == 0 && (d.Reason != ReasonCacheHit || d.Worker != "a" || d.MatchedChars != 60) {
			t.Errorf("dry run decision %+v", d)
		}
		if i == 1 && (d.Reason != ReasonCacheMiss || d.Worker != "a") {
			t.Errorf("dry run decision %+v", d)
		}
	}
	if got := snapshot(e); !slices.Equal(got, idxBefore) {
		t.Errorf("dry run changed the index:\n%v\n%v", idxBefore, got)
	}
	if loads(e) != loadBefore {
		t.Errorf("dry run changed loads: %s -> %s", loadBefore, loads(e))
	}
}

func TestReleaseGuard(t *testing.T) {
	e := newTestEngine(t, testPolicy(), urls("a", "b")...)
	setLoad(t, e, "a", 2)
	e.Release("a")
	e.Release("a")
	if e.Load("a") != 0 || e.Underflows != 0 {
		t.Fatalf("load %d underflows %d", e.Load("a"), e.Underflows)
	}
	e.Release("a")
	e.Release("b")
	if e.Load("a") != 0 || e.Load("b") != 0 || e.Underflows != 2 {
		t.Errorf("load a=%d b=%d underflows %d", e.Load("a"), e.Load("b"), e.Underflows)
	}
	e.Release("unknown") // removed while in flight: not an underflow
	if e.Underflows != 2 {
		t.Errorf("unknown URL counted as underflow")
	}
	// Load is still taken normally afterwards.
	setLoad(t, e, "a", 1)
	if e.Load("a") != 1 {
		t.Errorf("load %d", e.Load("a"))
	}
}

func TestSetWorkers(t *testing.T) {
	e := newTestEngine(t, testPolicy(), urls("a", "b", "c")...)
	ta, tb, tc := textOf(50, 0), textOf(50, 1), textOf(50, 2)
	place(t, e, "a", ta)
	place(t, e, "b", tb)
	place(t, e, "c", tc)
	place(t, e, "c", ta) // a and c share ta
	setLoad(t, e, "a", 2)
	e.SetHealthy("b", false)
	idC := idOf(t, e, "c")

	removed := e.SetWorkers([]WorkerSpec{{URL: "d"}, {URL: "b", MaxLoad: 7}, {URL: "a"}})
	if !slices.Equal(removed, []string{"c"}) {
		t.Errorf("removed %v", removed)
	}
	want := []WorkerState{
		{WorkerSpec: WorkerSpec{URL: "d"}, Healthy: true},
		{WorkerSpec: WorkerSpec{URL: "b", MaxLoad: 7}, Healthy: false},
		{WorkerSpec: WorkerSpec{URL: "a"}, Healthy: true, Load: 2},
	}
	if got := e.Workers(); !slices.Equal(got, want) {
		t.Errorf("Workers %+v want %+v", got, want)
	}
	// Before the purge, c's holdings are still in the index but count for
	// nobody: tc, which only c held, is a miss.
	if e.idx.Retiring() != 1 {
		t.Errorf("retiring %d workers, want 1", e.idx.Retiring())
	}
	if d, err := e.Choose(Request{Hashes: req(tc).Hashes, KeyLen: 50, DryRun: true}, 8); err != nil || d.Reason == ReasonCacheHit {
		t.Errorf("a removed worker's holding counted: %+v %v", d, err)
	}
	purge(t, e)
	// Kept workers keep their entries; c's are gone (tc entirely, ta now
	// held by a only).
	if holds(t, e, "a", ta) != 5 || holds(t, e, "b", tb) != 5 {
		t.Errorf("kept workers lost entries")
	}
	for _, h := range req(tc).Hashes {
		if e.idx.Holders(h) != nil {
			t.Errorf("removed worker's entry survived")
		}
	}
	for _, h := range req(ta).Hashes {
		for _, hd := range e.idx.Holders(h) {
			if hd.Worker == idC {
				t.Errorf("removed worker still holds ta")
			}
		}
	}
	if e.idx.Len() != 10 {
		t.Errorf("index len %d want 10", e.idx.Len())
	}
	// Routing still follows the warm cache.
	d, err := e.Choose(req(ta), 9)
	if err != nil || d.Worker != "a" || d.Reason != ReasonCacheHit {
		t.Errorf("after reload: %+v %v", d, err)
	}
	e.Release("c") // in flight when removed: ignored
	if e.Underflows != 0 {
		t.Error("release of removed worker counted")
	}
	// Re-adding c gives a fresh worker with nothing cached.
	e.SetWorkers(urls("a", "b", "c", "d"))
	if idOf(t, e, "c") == idC {
		t.Error("worker ID reused")
	}
	if holds(t, e, "c", tc) != 0 || e.Load("c") != 0 {
		t.Error("re-added worker inherited state")
	}
	removed = e.SetWorkers(nil)
	purge(t, e)
	if len(removed) != 4 || e.idx.Len() != 0 {
		t.Errorf("SetWorkers(nil): removed %v, index len %d", removed, e.idx.Len())
	}
	if _, err := e.Choose(Request{}, 1); !errors.Is(err, ErrNoWorkers) {
		t.Errorf("err %v", err)
	}
}

// purge runs maintenance steps until removed workers' holdings are gone.
func purge(t *testing.T, e *Engine) {
	t.Helper()
	for i := 0; !e.MaintainStep(0, 1<<30, 1); i++ {
		if i > 1000 {
			t.Fatal("purge did not finish")
		}
	}
	if e.idx.Retiring() != 0 {
		t.Fatalf("still retiring %d workers", e.idx.Retiring())
	}
}

func TestUnplace(t *testing.T) {
	pol := testPolicy()
	pol.Threshold = 0.25
	e := newTestEngine(t, pol, urls("a", "b")...)
	text := textOf(100, 0)
	place(t, e, "a", text[:30]) // a already holds blocks 0..2

	d, err := e.Choose(req(text), 1)
	if err != nil || d.Worker != "a" || d.Reason != ReasonCacheHit {
		t.Fatalf("%+v %v", d, err)
	}
	if len(d.Placed) != 7 || holds(t, e, "a", text) != 10 {
		t.Fatalf("placed %d, holds %d", len(d.Placed), holds(t, e, "a", text))
	}
	e.Release("a")
	e.Unplace(d)
	if got := holds(t, e, "a", text); got != 3 {
		t.Errorf("after Unplace a holds %d blocks, want its earlier 3", got)
	}
	if e.idx.Len() != 3 {
		t.Errorf("index len %d want 3", e.idx.Len())
	}

	// A hit that added nothing leaves nothing to unplace.
	d, _ = e.Choose(req(text[:30]), 2)
	if d.Placed != nil {
		t.Errorf("full hit placed %d", len(d.Placed))
	}
	e.Unplace(d)
	e.Release(d.Worker)
	if holds(t, e, "a", text) != 3 {
		t.Error("no-op Unplace removed blocks")
	}

	// hit_overloaded: withdrawing L's placement leaves C's intact.
	setLoad(t, e, "a", 3)
	d, _ = e.Choose(req(text[:30]), 3)
	if d.Reason != ReasonHitOverloaded || d.Worker != "b" || holds(t, e, "b", text) != 3 {
		t.Fatalf("%+v", d)
	}
	e.Unplace(d)
	if holds(t, e, "b", text) != 0 || holds(t, e, "a", text) != 3 {
		t.Errorf("after Unplace: a=%d b=%d", holds(t, e, "a", text), holds(t, e, "b", text))
	}

	// Miss: everything goes; worker removed meanwhile: no-op.
	d, _ = e.Choose(req(textOf(40, 9)), 4)
	e.Unplace(d)
	if e.idx.Len() != 3 {
		t.Errorf("index len %d after unplacing a miss", e.idx.Len())
	}
	d, _ = e.Choose(req(textOf(40, 9)), 5)
	e.SetWorkers(urls("a"))
	e.Unplace(d)
	e.Unplace(Decision{})
}

func TestModelSeedsMatch(t *testing.T) {
	e := newTestEngine(t, testPolicy(), urls("a", "b")...)
	text := textOf(100, 0)
	r := reqFor("model-1", text)
	r.Exclude = []string{"b"}
	e.Choose(r, 1)
	e.Release("a")
	setLoad(t, e, "a", 1)
	d, err := e.Choose(reqFor("model-2", text), 2)
	if err != nil || d.Reason != ReasonCacheMiss || d.Worker != "b" || d.MatchedChars != 0 {
		t.Errorf("other model: %+v %v", d, err)
	}
	d, err = e.Choose(reqFor("model-1", text), 3)
	if err != nil || d.Reason != ReasonCacheHit || d.Worker != "a" {
		t.Errorf("same model: %+v %v", d, err)
	}
}

// Ties are broken uniformly at random from the caller's source: check the
// distribution over many dry runs with generous bounds, and that a fixed
// seed reproduces the same choices.
func TestTieBreakDistribution(t *testing.T) {
	const n, runs = 4, 8000
	names := []string{"w0", "w1", "w2", "w3"}
	text := textOf(100, 0)
	cases := []struct {
		name   string
		setup  func(*Engine)
		req    Request
		reason Reason
	}{
		{"least loaded", func(*Engine) {}, Request{}, ReasonEmptyText},
		{"least loaded on a miss", func(*Engine) {}, req(textOf(100, 1)), ReasonCacheMiss},
		{"cache candidate", func(e *Engine) {
			for _, u := range names {
				place(t, e, u, text)
			}
		}, req(text), ReasonCacheHit},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEngine(t, testPolicy(), urls(names...)...)
			tc.setup(e)
			counts := map[string]int{}
			for i := range runs {
				r := tc.req
				r.DryRun = true
				d, err := e.Choose(r, int64(i))
				if err != nil || d.Reason != tc.reason {
					t.Fatalf("%+v %v", d, err)
				}
				counts[d.Worker]++
			}
			for _, u := range names {
				// Expected 2000 each; sd ~39. Bounds are ~7 sd wide.
				if c := counts[u]; c < runs/n*85/100 || c > runs/n*115/100 {
					t.Errorf("%s chosen %d times of %d: %v", u, c, runs, counts)
				}
			}
		})
	}

	seq := func(seed uint64) []string {
		e := New(testPolicy(), index.New(index.Options{MaxEntries: 100}), rand.New(rand.NewPCG(seed, 7)))
		e.SetWorkers(urls(names...))
		var out []string
		for i := range 64 {
			d, _ := e.Choose(Request{DryRun: true}, int64(i))
			out = append(out, d.Worker)
		}
		return out
	}
	if !slices.Equal(seq(42), seq(42)) {
		t.Error("same seed, different choices")
	}
	if slices.Equal(seq(42), seq(43)) {
		t.Error("different seeds, same 64 choices")
	}
}

// A real (non-dry) route stream spreads over idle workers and never picks
// a busier one while a less loaded one is usable.
func TestLeastLoadedNeverBusier(t *testing.T) {
	e := newTestEngine(t, testPolicy(), urls("a", "b", "c", "d", "e")...)
	r := newRand(3)
	var inflight []string
	for i := range 2000 {
		if len(inflight) > 0 && r.IntN(2) == 0 {
			j := r.IntN(len(inflight))
			e.Release(inflight[j])
			inflight = slices.Delete(inflight, j, j+1)
			continue
		}
		minLoad := 1 << 30
		for _, w := range e.Workers() {
			minLoad = min(minLoad, w.Load)
		}
		d, err := e.Choose(Request{}, int64(i))
		if err != nil {
			t.Fatal(err)
		}
		if e.Load(d.Worker)-1 != minLoad {
			t.Fatalf("picked %s with load %d, min %d", d.Worker, e.Load(d.Worker)-1, minLoad)
		}
		inflight = append(inflight, d.Worker)
	}
	if e.Underflows != 0 {
		t.Error("underflows")
	}
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed+1)) }

// The match path of a warm engine allocates nothing: hits (refresh), misses
// onto an already-known path of the chosen worker, and overloaded hits.
func TestRouteAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	e := newTestEngine(t, testPolicy(), urls("a", "b", "c", "d")...)
	long := strings.Repeat(textOf(1000, 0), 10)
	hit := req(long)
	place(t, e, "a", long)
	e.Choose(hit, 1) // warm the scratch buffers
	e.Release("a")
	if n := testing.AllocsPerRun(200, func() {
		d, _ := e.Choose(hit, 2)
		e.Release(d.Worker)
	}); n != 0 {
		t.Errorf("Route (hit) allocates %v times", n)
	}

	// Overloaded candidate: L becomes (and then stays) a second holder.
	setLoad(t, e, "a", 5)
	for range 64 { // every idle worker becomes a second holder once
		d, _ := e.Choose(hit, 3)
		e.Release(d.Worker)
	}
	if n := testing.AllocsPerRun(200, func() {
		d, _ := e.Choose(hit, 4)
		e.Release(d.Worker)
	}); n != 0 {
		t.Errorf("Route (hit_overloaded) allocates %v times", n)
	}
	dry := hit
	dry.DryRun = true
	if n := testing.AllocsPerRun(200, func() { e.Choose(dry, 5) }); n != 0 {
		t.Errorf("Route (dry run) allocates %v times", n)
	}
	excl := hit
	excl.Exclude = []string{"a", "b"}
	if n := testing.AllocsPerRun(200, func() {
		d, _ := e.Choose(excl, 6)
		e.Release(d.Worker)
	}); n != 0 {
		t.Errorf("Route (with exclusions) allocates %v times", n)
	}
}

// TestRouteFollowsSpec builds random scenarios (health, exclusions, loads,
// penalties, caps, placements, thresholds) and checks every decision
// against the rules written out independently here: the usable set, the
// least-loaded set L, the cache candidate set C (longest match, then least
// loaded), the match rule and the balance rule. Ties may go either way, so
// the chosen worker must be in the right set.
func TestRouteFollowsSpec(t *testing.T) {
	base := textOf(100, 0)
	names := []string{"a", "b", "c", "d", "e"}
	r := newRand(11)
	pick := func(xs ...float64) float64 { return xs[r.IntN(len(xs))] }
	seen := map[string]int{}
	for sc := range 1000 {
		pol := Policy{
			Threshold:           pick(0, 0.3, 0.5, 0.8, 1),
			MatchAbsThreshold:   int(pick(0, 0, 20, 45)),
			BalanceAbsThreshold: int(pick(0, 1, 2, 3)),
			BalanceRelThreshold: pick(0, 1, 1.5, 2),
			BlockChars:          testBC,
		}
		specs := make([]WorkerSpec, 1+r.IntN(len(names)))
		for i := range specs {
			specs[i] = WorkerSpec{URL: names[i], MaxLoad: int(pick(0, 0, 1, 2, 4)), LoadPenalty: int(pick(0, 0, 1, 3))}
		}
		e := newTestEngine(t, pol, specs...)
		for range r.IntN(6) {
			w := specs[r.IntN(len(specs))].URL
			if r.IntN(4) == 0 {
				place(t, e, w, textOf(10+r.IntN(90), 3)) // unrelated text
			} else {
				place(t, e, w, base[:1+r.IntN(100)])
			}
		}
		for _, s := range specs {
			n := r.IntN(4)
			if s.MaxLoad > 0 {
				n = min(n, s.MaxLoad)
			}
			setLoad(t, e, s.URL, n)
		}
		var exclude []string
		for _, s := range specs {
			if r.IntN(5) == 0 {
				e.SetHealthy(s.URL, false)
			}
			if r.IntN(5) == 0 {
				exclude = append(exclude, s.URL)
			}
		}
		q := req(base[:r.IntN(101)])
		switch r.IntN(10) {
		case 0:
			q = req(textOf(1+r.IntN(100), 7))
		case 1:
			q = Request{}
		}
		q.Exclude = exclude

		// The rules, from the spec.
		eff := map[string]int{}
		var usable []string
		healthy, notExcluded := 0, 0
		for _, w := range e.Workers() {
			eff[w.URL] = w.Load + w.LoadPenalty
			if !w.Healthy {
				continue
			}
			healthy++
			if slices.Contains(exclude, w.URL) {
				continue
			}
			notExcluded++
			if w.MaxLoad > 0 && w.Load >= w.MaxLoad {
				continue
			}
			usable = append(usable, w.URL)
		}
		var wantErr error
		switch {
		case len(usable) > 0:
		case healthy == 0:
			wantErr = ErrNoHealthy
		case notExcluded == 0:
			wantErr = ErrAllExcluded
		default:
			wantErr = ErrAllSaturated
		}
		argmin := func(ws []string) []string {
			var out []string
			for _, w := range ws {
				if len(out) == 0 || eff[w] < eff[out[0]] {
					out = []string{w}
				} else if eff[w] == eff[out[0]] {
					out = append(out, w)
				}
			}
			return out
		}
		L := argmin(usable)
		var m index.Match
		e.idx.Lookup(q.Hashes, &m)
		best := 0
		var holders []string
		for _, w := range usable {
			switch b := m.BlocksFor(idOf(t, e, w)); {
			case b > best:
				best, holders = b, []string{w}
			case b == best && b > 0:
				holders = append(holders, w)
			}
		}
		C := argmin(holders)
		chars := index.MatchedChars(best, q.KeyLen, testBC)
		var wantReason Reason
		wantSet := L
		switch {
		case q.KeyLen == 0:
			wantReason = ReasonEmptyText
		case len(C) == 0:
			wantReason = ReasonCacheMiss
		case float64(chars)/float64(q.KeyLen) < pol.Threshold && (pol.MatchAbsThreshold == 0 || chars < pol.MatchAbsThreshold):
			wantReason = ReasonCacheMiss
		case eff[C[0]]-eff[L[0]] > pol.BalanceAbsThreshold && float64(eff[C[0]]) > float64(eff[L[0]])*pol.BalanceRelThreshold:
			wantReason = ReasonHitOverloaded
		default:
			wantReason, wantSet = ReasonCacheHit, C
		}

		if wantErr != nil {
			seen[wantErr.Error()]++
		} else {
			seen[string(wantReason)]++
		}
		for _, dry := range []bool{true, false} {
			q.DryRun = dry
			d, err := e.Choose(q, 1000)
			where := func() string {
				return fmt.Sprintf("scenario %d dry=%v pol=%+v %s exclude=%v query=%d chars: %+v", sc, dry, pol, loads(e), exclude, q.KeyLen, d)
			}
			if !errors.Is(err, wantErr) {
				t.Fatalf("%s: err %v want %v", where(), err, wantErr)
			}
			if err != nil {
				break
			}
			if d.Reason != wantReason || !slices.Contains(wantSet, d.Worker) {
				t.Fatalf("%s: want %s to one of %v (L=%v C=%v)", where(), wantReason, wantSet, L, C)
			}
			if wantReason == ReasonHitOverloaded || wantReason == ReasonCacheHit {
				if !slices.Contains(C, d.Candidate) || d.MatchedChars != chars {
					t.Fatalf("%s: candidate/match, want one of %v with %d chars", where(), C, chars)
				}
			} else if d.Candidate != "" {
				t.Fatalf("%s: candidate on %s", where(), d.Reason)
			}
			if dry {
				continue
			}
			// Real route: load taken, prefix recorded, Placed = the blocks
			// the chosen worker did not hold before.
			had := m.BlocksFor(idOf(t, e, d.Worker))
			switch {
			case d.Reason == ReasonEmptyText:
				if d.Placed != nil {
					t.Fatalf("%s: placed on empty text", where())
				}
			case !slices.Equal(d.Placed, q.Hashes[had:]) && !(had == len(q.Hashes) && d.Placed == nil):
				t.Fatalf("%s: placed %d hashes, worker held %d of %d", where(), len(d.Placed), had, len(q.Hashes))
			default:
				var after index.Match
				e.idx.Lookup(q.Hashes, &after)
				if after.BlocksFor(idOf(t, e, d.Worker)) != len(q.Hashes) {
					t.Fatalf("%s: prefix not recorded", where())
				}
			}
		}
	}
	// The scenarios must cover every outcome, or the test proves little.
	for _, k := range []string{string(ReasonCacheHit), string(ReasonCacheMiss), string(ReasonHitOverloaded),
		string(ReasonEmptyText), ErrNoHealthy.Error(), ErrAllExcluded.Error(), ErrAllSaturated.Error()} {
		if seen[k] < 3 {
			t.Errorf("outcome %q seen %d times: %v", k, seen[k], seen)
		}
	}
	t.Logf("outcomes: %v", seen)
}
