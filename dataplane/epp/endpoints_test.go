package epp

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cartrouter/cart/dataplane/router"
)

func TestEndpoint(t *testing.T) {
	for in, want := range map[string]string{
		"http://10.0.0.5:8000":           "10.0.0.5:8000",
		"http://10.0.0.5":                "10.0.0.5:80",
		"https://10.0.0.5":               "10.0.0.5:443",
		"http://[fd00::5]:8000/v1":       "[fd00::5]:8000",
		"http://[::ffff:10.0.0.5]:8000":  "10.0.0.5:8000",
		"http://vllm-0.vllm.svc:8000":    "",
		"http://[fe80::1%25eth0]:8000":   "[fe80::1]:8000",
		"not a url at all":               "",
		"http://10.0.0.5:8000?x=1#frag.": "10.0.0.5:8000",
	} {
		got, ok := Endpoint(in)
		if got != want || ok != (want != "") {
			t.Errorf("Endpoint(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}

func ws(specs ...router.WorkerStatus) []router.WorkerStatus { return specs }

func w(url string, load int, mod func(*router.WorkerStatus)) router.WorkerStatus {
	s := router.WorkerStatus{URL: url, Load: load, Healthy: true}
	if mod != nil {
		mod(&s)
	}
	return s
}

func TestExcluded(t *testing.T) {
	p := newPool(ws(w("http://10.0.0.1:80", 0, nil), w("http://10.0.0.2:80", 0, nil), w("http://named:80", 0, nil)))
	for name, c := range map[string]struct {
		subset []string
		want   []string
	}{
		"no hint: only the worker without an address": {nil, []string{"http://named:80"}},
		"hint of one":                {[]string{"10.0.0.2:80"}, []string{"http://10.0.0.1:80", "http://named:80"}},
		"empty hint: everyone":       {[]string{}, []string{"http://10.0.0.1:80", "http://10.0.0.2:80", "http://named:80"}},
		"hint in another spelling":   {[]string{"[::ffff:10.0.0.1]:80", " 10.0.0.2:80 "}, []string{"http://named:80"}},
		"hint naming nobody we know": {[]string{"10.9.9.9:80", "junk"}, []string{"http://10.0.0.1:80", "http://10.0.0.2:80", "http://named:80"}},
	} {
		if got := p.excluded(c.subset); !slices.Equal(got, c.want) {
			t.Errorf("%s: excluded %v, want %v", name, got, c.want)
		}
	}
	if got := p.worker("10.0.0.2:80"); got != "http://10.0.0.2:80" {
		t.Errorf("worker(10.0.0.2:80) = %q", got)
	}
	if got := p.worker("10.9.9.9:80"); got != "10.9.9.9:80" {
		t.Errorf("worker of an unknown address = %q, want the address", got)
	}
}

func TestFallbacks(t *testing.T) {
	const a, b, c, d, e = "http://10.0.0.1:80", "http://10.0.0.2:80", "http://10.0.0.3:80", "http://10.0.0.4:80", "http://10.0.0.5:80"
	unhealthy := func(s *router.WorkerStatus) { s.Healthy = false }
	draining := func(s *router.WorkerStatus) { s.Draining = true }
	full := func(s *router.WorkerStatus) { s.MaxLoad = 2 }
	penalty := func(s *router.WorkerStatus) { s.LoadPenalty = 10 }
	for name, tc := range map[string]struct {
		workers []router.WorkerStatus
		c       choice
		want    []string
	}{
		"none asked": {ws(w(a, 0, nil), w(b, 0, nil)), choice{Primary: a}, nil},
		"least loaded first, the primary never": {ws(w(a, 0, nil), w(b, 5, nil), w(c, 1, nil), w(d, 3, nil)),
			choice{Primary: a, N: 2}, []string{c, d}},
		"the prefix candidate first": {ws(w(a, 0, nil), w(b, 5, nil), w(c, 1, nil)),
			choice{Primary: a, Candidate: b, N: 2}, []string{b, c}},
		"penalty counts as load": {ws(w(a, 0, nil), w(b, 1, penalty), w(c, 3, nil)),
			choice{Primary: a, N: 1}, []string{c}},
		"unusable workers are skipped": {ws(w(a, 0, nil), w(b, 0, unhealthy), w(c, 0, draining), w(d, 2, full), w(e, 9, nil)),
			choice{Primary: a, N: 4}, []string{e}},
		"excluded and avoided are skipped": {ws(w(a, 0, nil), w(b, 0, nil), w(c, 0, nil), w(d, 1, nil)),
			choice{Primary: a, Exclude: []string{b}, Avoid: []string{c}, N: 3}, []string{d}},
		"an excluded candidate is no fallback": {ws(w(a, 0, nil), w(b, 0, nil), w(c, 1, nil)),
			choice{Primary: a, Candidate: b, Exclude: []string{b}, N: 2}, []string{c}},
		"another worker key is no fallback": {ws(w(a, 0, nil), w(b, 0, nil), w(c, 1, nil)),
			choice{Primary: a, N: 2, SameKey: func(u string) bool { return u != b }}, []string{c}},
		"a worker without an address is no fallback": {ws(w(a, 0, nil), w("http://named:80", 0, nil)),
			choice{Primary: a, N: 2}, []string{}},
	} {
		got := newPool(tc.workers).fallbacks(tc.c, rand.New(rand.NewPCG(1, 2)).Shuffle)
		if !slices.Equal(got, tc.want) && !(len(got) == 0 && len(tc.want) == 0) {
			t.Errorf("%s: %v, want %v", name, got, tc.want)
		}
	}
	// Ties are broken at random, so that pickers do not all name the
	// same fallback.
	seen := map[string]bool{}
	p := newPool(ws(w(a, 0, nil), w(b, 1, nil), w(c, 1, nil), w(d, 1, nil)))
	rnd := rand.New(rand.NewPCG(3, 4))
	for range 100 {
		seen[p.fallbacks(choice{Primary: a, N: 1}, rnd.Shuffle)[0]] = true
	}
	if len(seen) != 3 {
		t.Errorf("tied fallbacks chosen: %v, want each of the three", seen)
	}
	if dest, ok := p.answer(a, []string{c, b}); !ok || dest != "10.0.0.1:80,10.0.0.3:80,10.0.0.2:80" {
		t.Errorf("answer = %q, %v", dest, ok)
	}
	if _, ok := p.answer("http://named:80", nil); ok {
		t.Error("a primary without an address made an answer")
	}
}
