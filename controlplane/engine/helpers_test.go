package engine

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cartrouter/cart/controlplane/index"
)

const testBC = 10 // block size used by the tests

func testPolicy() Policy {
	return Policy{
		Threshold:           0.5,
		BalanceAbsThreshold: 2,
		BalanceRelThreshold: 1.5,
		BlockChars:          testBC,
	}
}

func newTestEngine(t testing.TB, pol Policy, specs ...WorkerSpec) *Engine {
	t.Helper()
	if pol.BlockChars == 0 {
		pol.BlockChars = testBC
	}
	e := New(pol, index.New(index.Options{MaxEntries: 100_000}), rand.New(rand.NewPCG(1, 2)))
	e.SetWorkers(specs)
	return e
}

func urls(names ...string) []WorkerSpec {
	out := make([]WorkerSpec, len(names))
	for i, n := range names {
		out[i] = WorkerSpec{URL: n}
	}
	return out
}

// textOf returns n deterministic characters; different seeds differ in
// every block.
func textOf(n int, seed byte) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'a' + (seed+byte(i*7)+byte(i/testBC)*13)%26
	}
	return string(b)
}

func reqFor(model, text string) Request {
	return Request{Hashes: index.Hash(nil, model, []byte(text), testBC), KeyLen: len(text)}
}

func req(text string) Request { return reqFor("m", text) }

// others returns every configured URL except keep.
func others(e *Engine, keep string) []string {
	var out []string
	for _, w := range e.workers {
		if w.spec.URL != keep {
			out = append(out, w.spec.URL)
		}
	}
	return out
}

// setLoad takes n units of load on url (empty-text routes pinned there).
func setLoad(t testing.TB, e *Engine, url string, n int) {
	t.Helper()
	for range n {
		d, err := e.Choose(Request{Exclude: others(e, url), AnyRole: true}, 0)
		if err != nil || d.Worker != url {
			t.Fatalf("setLoad(%s): %v %v", url, d, err)
		}
	}
}

// engineIn is a test engine over specs in a given state: load[url] in
// flight on each worker and the unhealthy ones marked down.
func engineIn(t testing.TB, specs []WorkerSpec, load map[string]int, unhealthy []string) *Engine {
	t.Helper()
	e := newTestEngine(t, testPolicy(), specs...)
	for url, n := range load {
		setLoad(t, e, url, n)
	}
	for _, u := range unhealthy {
		e.SetHealthy(u, false)
	}
	return e
}

// place records text's prefix for url without changing its load.
func place(t testing.TB, e *Engine, url, text string) {
	t.Helper()
	r := req(text)
	r.Exclude = others(e, url)
	d, err := e.Choose(r, 1)
	if err != nil || d.Worker != url {
		t.Fatalf("place(%s): %v %v", url, d, err)
	}
	e.Release(url)
}

func idOf(t testing.TB, e *Engine, url string) index.WorkerID {
	t.Helper()
	w, ok := e.byURL[url]
	if !ok {
		t.Fatalf("no worker %s", url)
	}
	return w.id
}

// holds returns how many leading blocks of text url holds in the index.
func holds(t testing.TB, e *Engine, url, text string) int {
	t.Helper()
	var m index.Match
	e.idx.Lookup(req(text).Hashes, &m)
	return m.BlocksFor(idOf(t, e, url))
}

func loads(e *Engine) string {
	var s []string
	for _, w := range e.Workers() {
		s = append(s, fmt.Sprintf("%s=%d", w.URL, w.Load))
	}
	return fmt.Sprint(s)
}

// snapshot captures the index content and LRU order.
func snapshot(e *Engine) []string {
	var out []string
	e.idx.Walk(func(h uint64, used int64, hs []index.Holder) bool {
		hs = slices.Clone(hs)
		slices.SortFunc(hs, func(a, b index.Holder) int { return int(a.Worker) - int(b.Worker) })
		out = append(out, fmt.Sprintf("%x@%d:%v", h, used, hs))
		return true
	})
	return out
}
