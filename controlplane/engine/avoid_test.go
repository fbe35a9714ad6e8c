package engine

import (
	"errors"
	"slices"
	"testing"
)

// Avoid is soft: avoided workers are kept out while anyone else can take
// the request, and taken as a trial (AvoidIgnored) when nobody else can.
// Hard exclusions, health, draining and max_load always win over it.
func TestAvoid(t *testing.T) {
	tests := []struct {
		name      string
		specs     []WorkerSpec
		unhealthy []string
		load      map[string]int
		exclude   []string
		avoid     []string
		want      []string // acceptable workers; nil: an error
		ignored   bool
		wantErr   error
	}{
		{"nothing avoided", urls("a", "b"), nil, nil, nil, nil, []string{"a", "b"}, false, nil},
		{"one avoided", urls("a", "b"), nil, nil, nil, []string{"a"}, []string{"b"}, false, nil},
		{"all avoided: trial", urls("a", "b"), nil, nil, nil, []string{"a", "b"}, []string{"a", "b"}, true, nil},
		{"rest excluded: trial on the avoided", urls("a", "b"), nil, nil, []string{"b"}, []string{"a"}, []string{"a"}, true, nil},
		{"rest unhealthy: trial on the avoided", urls("a", "b"), []string{"b"}, nil, nil, []string{"a"}, []string{"a"}, true, nil},
		{"rest saturated: trial on the avoided", []WorkerSpec{{URL: "a"}, {URL: "b", MaxLoad: 1}}, nil, map[string]int{"b": 1}, nil, []string{"a"}, []string{"a"}, true, nil},
		{"avoided and excluded stays out", urls("a", "b"), nil, nil, []string{"a"}, []string{"a", "b"}, []string{"b"}, true, nil},
		{"avoided but unhealthy: no trial", urls("a", "b"), []string{"a", "b"}, nil, nil, []string{"a"}, nil, false, ErrNoHealthy},
		{"avoided but saturated: no trial", []WorkerSpec{{URL: "a", MaxLoad: 1}}, nil, map[string]int{"a": 1}, nil, []string{"a"}, nil, false, ErrAllSaturated},
		{"excluded all, avoid nothing", urls("a"), nil, nil, []string{"a"}, nil, nil, false, ErrAllExcluded},
		{"unknown avoid is harmless", urls("a"), nil, nil, nil, []string{"zzz"}, []string{"a"}, false, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := engineIn(t, tt.specs, tt.load, tt.unhealthy)
			for _, text := range []string{"", textOf(40, 0)} {
				r := req(text)
				if text == "" {
					r = Request{}
				}
				r.Exclude, r.Avoid, r.DryRun = tt.exclude, tt.avoid, true
				d, err := e.Choose(r, 1)
				if tt.wantErr != nil {
					if !errors.Is(err, tt.wantErr) || d.Worker != "" {
						t.Fatalf("text %q: %+v %v, want %v", text, d, err, tt.wantErr)
					}
					continue
				}
				if err != nil || !slices.Contains(tt.want, d.Worker) || d.AvoidIgnored != tt.ignored {
					t.Fatalf("text %q: worker %q ignored=%v err %v; want one of %v, ignored=%v", text, d.Worker, d.AvoidIgnored, err, tt.want, tt.ignored)
				}
			}
		})
	}
}

// An avoided cache holder loses the request to a healthy miss; the trial
// on it, when it is the only one left, still counts as a cache hit.
func TestAvoidKeepsCacheRules(t *testing.T) {
	e := newTestEngine(t, testPolicy(), urls("a", "b")...)
	text := textOf(60, 0)
	place(t, e, "a", text)
	r := req(text)
	r.Avoid, r.DryRun = []string{"a"}, true
	d, err := e.Choose(r, 1)
	if err != nil || d.Worker != "b" || d.Reason != ReasonCacheMiss || d.AvoidIgnored {
		t.Fatalf("avoided holder: %+v %v", d, err)
	}
	r.Exclude = []string{"b"}
	d, err = e.Choose(r, 2)
	if err != nil || d.Worker != "a" || d.Reason != ReasonCacheHit || !d.AvoidIgnored {
		t.Fatalf("trial on the holder: %+v %v", d, err)
	}
}
