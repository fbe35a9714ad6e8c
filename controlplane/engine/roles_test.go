package engine

import (
	"errors"
	"testing"
)

func splitPool(extra ...WorkerSpec) []WorkerSpec {
	return append([]WorkerSpec{
		{URL: "p1", Role: RolePrefill}, {URL: "p2", Role: RolePrefill},
		{URL: "d1", Role: RoleDecode}, {URL: "d2", Role: RoleDecode},
	}, extra...)
}

func pairReq(text string) Request {
	r := req(text)
	r.Disagg = DisaggPair
	return r
}

func TestParseRole(t *testing.T) {
	for in, want := range map[string]Role{"": RoleBoth, "both": RoleBoth, "prefill": RolePrefill, "decode": RoleDecode} {
		if got, err := ParseRole(in); err != nil || got != want {
			t.Errorf("ParseRole(%q) = %v, %v; want %v", in, got, err, want)
		}
		if in != "" && want.String() != in {
			t.Errorf("%v.String() = %q", want, want.String())
		}
	}
	if _, err := ParseRole("Prefill"); err == nil {
		t.Error("ParseRole accepted a misspelt role")
	}
}

// A pair: the prefill worker by prefix, the decode worker by load, each
// with a unit of load of its own; the placement on the prefill worker only.
func TestRoutePairChoosesPrefillByPrefixAndDecodeByLoad(t *testing.T) {
	e := newTestEngine(t, testPolicy(), splitPool()...)
	text := textOf(200, 1)
	first, err := e.Choose(pairReq(text), 1)
	if err != nil {
		t.Fatal(err)
	}
	if first.Reason != ReasonPD || first.Prefill == nil || first.Whole != "" {
		t.Fatalf("first: %+v", first)
	}
	pre := first.Prefill.Worker
	if e.Load(pre) != 1 || e.Load(first.Worker) != 1 {
		t.Fatalf("loads after a pair: %s=%d %s=%d", pre, e.Load(pre), first.Worker, e.Load(first.Worker))
	}
	if pre[0] != 'p' || first.Worker[0] != 'd' {
		t.Fatalf("pair %s/%s: wrong roles", pre, first.Worker)
	}
	if len(first.Prefill.Placed) == 0 || len(first.Placed) != 0 {
		t.Fatalf("placed: prefill %d blocks, decode %d; want the prompt on the prefill worker only", len(first.Prefill.Placed), len(first.Placed))
	}
	// The same prompt again: its prefill worker holds it; the decode
	// worker is the other one, now less loaded.
	second, err := e.Choose(pairReq(text), 2)
	if err != nil {
		t.Fatal(err)
	}
	if second.Prefill.Worker != pre || second.Prefill.Reason != ReasonCacheHit {
		t.Fatalf("second prefill %s (%s), want %s by cache_hit", second.Prefill.Worker, second.Prefill.Reason, pre)
	}
	if second.Worker == first.Worker {
		t.Fatalf("second decode %s: not the least loaded", second.Worker)
	}
	if second.MatchedChars != second.Prefill.MatchedChars || second.MatchedChars == 0 {
		t.Fatalf("pair match %d, prefill's %d", second.MatchedChars, second.Prefill.MatchedChars)
	}
	for _, w := range []string{pre, first.Worker, second.Worker} {
		e.Release(w)
	}
	e.Release(pre)
	for _, w := range e.Workers() {
		if w.Load != 0 {
			t.Fatalf("%s load %d after releasing every leg", w.URL, w.Load)
		}
	}
	if e.Underflows != 0 {
		t.Fatalf("underflows %d", e.Underflows)
	}
}

func TestRouteRolesTable(t *testing.T) {
	long, short := textOf(400, 2), textOf(30, 3)
	type want struct {
		worker  string // exact, or "" to skip
		role    Role
		prefill bool
		whole   string
		err     error
	}
	cases := []struct {
		name  string
		pol   func(*Policy)
		specs []WorkerSpec
		setup func(*testing.T, *Engine)
		req   Request
		want  want
	}{
		{name: "whole request never to a prefill worker", specs: splitPool(WorkerSpec{URL: "b1"}),
			req: req(long), want: want{worker: "b1", role: RoleBoth}},
		{name: "whole request in a pool without both workers goes to decode", specs: splitPool(),
			req: req(long), want: want{role: RoleDecode}},
		{name: "whole request: both worker down, decode takes it", specs: splitPool(WorkerSpec{URL: "b1"}),
			setup: func(t *testing.T, e *Engine) { e.SetHealthy("b1", false) }, req: req(long), want: want{role: RoleDecode}},
		{name: "pair asked in a pool that is not split", specs: urls("a", "b"),
			req: pairReq(long), want: want{role: RoleBoth}},
		{name: "pair", specs: splitPool(WorkerSpec{URL: "b1"}),
			req: pairReq(long), want: want{role: RoleDecode, prefill: true}},
		{name: "short prompt under the threshold goes whole to a both worker", specs: splitPool(WorkerSpec{URL: "b1"}),
			pol: func(p *Policy) { p.PDThresholdTokens = 20 }, req: pairReq(short),
			want: want{worker: "b1", whole: WholeShortPrompt}},
		{name: "short prompt in a pool without both workers: decode alone, as llm-d", specs: splitPool(),
			pol: func(p *Policy) { p.PDThresholdTokens = 20 }, req: pairReq(short),
			want: want{role: RoleDecode, whole: WholeShortPrompt}},
		{name: "long prompt over the threshold is split", specs: splitPool(WorkerSpec{URL: "b1"}),
			pol: func(p *Policy) { p.PDThresholdTokens = 20 }, req: pairReq(long),
			want: want{role: RoleDecode, prefill: true}},
		{name: "long prompt mostly cached on the both worker goes whole", specs: splitPool(WorkerSpec{URL: "b1"}),
			pol: func(p *Policy) { p.PDThresholdTokens = 20 },
			setup: func(t *testing.T, e *Engine) {
				if _, err := e.Choose(req(long), 0); err != nil {
					t.Fatal(err)
				}
			},
			req: pairReq(long + "tail"), want: want{worker: "b1", whole: WholeShortPrompt}},
		{name: "every prefill worker failed this request: whole on both", specs: splitPool(WorkerSpec{URL: "b1"}),
			req:  func() Request { r := pairReq(long); r.Exclude = []string{"p1", "p2"}; return r }(),
			want: want{worker: "b1", whole: WholeNoPrefill}},
		{name: "every prefill worker down, no both: decode computes it whole", specs: splitPool(),
			setup: func(t *testing.T, e *Engine) { e.SetHealthy("p1", false); e.SetHealthy("p2", false) },
			req:   pairReq(long), want: want{role: RoleDecode, whole: WholeNoPrefill}},
		{name: "every decode worker failed: whole on both", specs: splitPool(WorkerSpec{URL: "b1"}),
			req:  func() Request { r := pairReq(long); r.Exclude = []string{"d1", "d2"}; return r }(),
			want: want{worker: "b1", whole: WholeNoDecode}},
		{name: "every decode worker down, no both: no worker", specs: splitPool(),
			setup: func(t *testing.T, e *Engine) { e.SetHealthy("d1", false); e.SetHealthy("d2", false) },
			req:   pairReq(long), want: want{err: ErrNoHealthy}},
		{name: "prefill saturated, no both in service: wait for a slot", specs: []WorkerSpec{
			{URL: "p1", Role: RolePrefill, MaxLoad: 1}, {URL: "d1", Role: RoleDecode}},
			setup: func(t *testing.T, e *Engine) { setLoad(t, e, "p1", 1) }, req: pairReq(long), want: want{err: ErrAllSaturated}},
		{name: "prefill saturated, a both worker has room: whole there", specs: []WorkerSpec{
			{URL: "p1", Role: RolePrefill, MaxLoad: 1}, {URL: "d1", Role: RoleDecode}, {URL: "b1"}},
			setup: func(t *testing.T, e *Engine) { setLoad(t, e, "p1", 1) }, req: pairReq(long), want: want{worker: "b1", whole: WholeNoPrefill}},
		{name: "decode saturated and no both: wait", specs: []WorkerSpec{
			{URL: "p1", Role: RolePrefill}, {URL: "d1", Role: RoleDecode, MaxConcurrency: 1}},
			setup: func(t *testing.T, e *Engine) { setLoad(t, e, "d1", 1) }, req: pairReq(long), want: want{err: ErrAllSaturated}},
		{name: "decode saturated, both saturated: wait", specs: []WorkerSpec{
			{URL: "p1", Role: RolePrefill}, {URL: "d1", Role: RoleDecode, MaxLoad: 1}, {URL: "b1", MaxLoad: 1}},
			setup: func(t *testing.T, e *Engine) { setLoad(t, e, "d1", 1); setLoad(t, e, "b1", 1) },
			req:   pairReq(long), want: want{err: ErrAllSaturated}},
		{name: "decode leg alone: least-loaded decode worker, exclusions kept", specs: splitPool(WorkerSpec{URL: "b1"}),
			req:  func() Request { r := req(long); r.Disagg = DisaggDecode; r.Exclude = []string{"d1"}; return r }(),
			want: want{worker: "d2"}},
		{name: "decode leg with every decode worker excluded", specs: splitPool(WorkerSpec{URL: "b1"}),
			req:  func() Request { r := req(long); r.Disagg = DisaggDecode; r.Exclude = []string{"d1", "d2"}; return r }(),
			want: want{err: ErrAllExcluded}},
		{name: "any role: a pinned request reaches its prefill worker", specs: splitPool(),
			req:  func() Request { r := pairReq(long); r.AnyRole = true; r.Exclude = []string{"p2", "d1", "d2"}; return r }(),
			want: want{worker: "p1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pol := testPolicy()
			if tc.pol != nil {
				tc.pol(&pol)
			}
			e := newTestEngine(t, pol, tc.specs...)
			if tc.setup != nil {
				tc.setup(t, e)
			}
			before := map[string]int{}
			for _, w := range e.Workers() {
				before[w.URL] = w.Load
			}
			d, err := e.Choose(tc.req, 10)
			if tc.want.err != nil {
				if !errors.Is(err, tc.want.err) {
					t.Fatalf("err %v, want %v (decision %+v)", err, tc.want.err, d)
				}
				for _, w := range e.Workers() {
					if w.Load != before[w.URL] {
						t.Fatalf("a refused request took load on %s", w.URL)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.want.worker != "" && d.Worker != tc.want.worker {
				t.Fatalf("worker %s, want %s (%+v)", d.Worker, tc.want.worker, d)
			}
			if tc.want.worker == "" && roleOf(e, d.Worker) != tc.want.role {
				t.Fatalf("worker %s of role %v, want %v", d.Worker, roleOf(e, d.Worker), tc.want.role)
			}
			if (d.Prefill != nil) != tc.want.prefill || d.Whole != tc.want.whole {
				t.Fatalf("prefill %v whole %q, want %v %q", d.Prefill, d.Whole, tc.want.prefill, tc.want.whole)
			}
			if d.Prefill != nil && (roleOf(e, d.Prefill.Worker) != RolePrefill || d.Reason != ReasonPD) {
				t.Fatalf("pair %+v", d)
			}
			taken := 1
			if d.Prefill != nil {
				taken = 2
			}
			got := 0
			for _, w := range e.Workers() {
				got += w.Load - before[w.URL]
			}
			if got != taken {
				t.Fatalf("took %d units of load, want %d", got, taken)
			}
		})
	}
}

func roleOf(e *Engine, url string) Role {
	for _, w := range e.Workers() {
		if w.URL == url {
			return w.Role
		}
	}
	return 255
}

// A dry run names both workers of a pair and takes nothing.
func TestRoutePairDryRun(t *testing.T) {
	e := newTestEngine(t, testPolicy(), splitPool()...)
	r := pairReq(textOf(300, 4))
	r.DryRun = true
	d, err := e.Choose(r, 1)
	if err != nil || d.Prefill == nil {
		t.Fatalf("%+v %v", d, err)
	}
	for _, w := range e.Workers() {
		if w.Load != 0 {
			t.Fatalf("dry run took load on %s", w.URL)
		}
	}
	r.DryRun = false
	if d2, _ := e.Choose(r, 2); d2.Prefill.Reason != ReasonCacheMiss {
		t.Fatalf("a dry run placed the prompt: %+v", d2.Prefill)
	}
}

// The avoid list is soft on either leg.
func TestRoutePairAvoid(t *testing.T) {
	e := newTestEngine(t, testPolicy(), WorkerSpec{URL: "p1", Role: RolePrefill}, WorkerSpec{URL: "d1", Role: RoleDecode})
	r := pairReq(textOf(300, 5))
	r.Avoid = []string{"p1", "d1"}
	d, err := e.Choose(r, 1)
	if err != nil || d.Prefill == nil || !d.AvoidIgnored {
		t.Fatalf("%+v %v", d, err)
	}
}
