package engine

import (
	"slices"
	"testing"
)

func TestAdjustLoad(t *testing.T) {
	e := newTestEngine(t, testPolicy(), urls("a", "b")...)
	e.AdjustLoad("a", 3)
	e.AdjustLoad("a", -1)
	if e.Load("a") != 2 || e.Underflows != 0 {
		t.Fatalf("load %d underflows %d", e.Load("a"), e.Underflows)
	}
	e.AdjustLoad("a", -5) // clamped at zero and counted
	if e.Load("a") != 0 || e.Underflows != 1 {
		t.Fatalf("load %d underflows %d", e.Load("a"), e.Underflows)
	}
	e.AdjustLoad("a", -2)
	e.AdjustLoad("zzz", 4) // unknown: ignored
	if e.Load("a") != 0 || e.Underflows != 2 || e.Load("zzz") != 0 {
		t.Fatalf("load %d underflows %d", e.Load("a"), e.Underflows)
	}
	e.AdjustLoad("b", 0)
	if e.Underflows != 2 {
		t.Error("zero delta counted")
	}
	// Adjusted load drives routing like placed load.
	e.AdjustLoad("a", 4)
	if d, _ := e.Choose(Request{}, 1); d.Worker != "b" {
		t.Errorf("routed to %s with %s", d.Worker, loads(e))
	}
}

func TestResetLoads(t *testing.T) {
	e := newTestEngine(t, testPolicy(), urls("a", "b", "c")...)
	setLoad(t, e, "a", 2)
	e.AdjustLoad("c", 7)
	e.ResetLoads()
	for _, w := range e.Workers() {
		if w.Load != 0 {
			t.Errorf("%s load %d", w.URL, w.Load)
		}
	}
	e.Release("a")
	if e.Underflows != 1 {
		t.Errorf("release after reset: underflows %d", e.Underflows)
	}
}

func TestWorkerIDs(t *testing.T) {
	e := newTestEngine(t, testPolicy(), urls("a", "b")...)
	ida, ok := e.WorkerIDOf("a")
	if !ok {
		t.Fatal("a unknown")
	}
	if u, ok := e.WorkerURL(ida); !ok || u != "a" {
		t.Errorf("WorkerURL(%d) = %q %v", ida, u, ok)
	}
	if _, ok := e.WorkerIDOf("zzz"); ok {
		t.Error("unknown URL has an id")
	}
	idb, _ := e.WorkerIDOf("b")
	e.SetWorkers(urls("a", "c"))
	if _, ok := e.WorkerURL(idb); ok {
		t.Error("removed worker's id still resolves")
	}
	idc, _ := e.WorkerIDOf("c")
	if idc == ida || idc == idb {
		t.Errorf("ids reused: a=%d b=%d c=%d", ida, idb, idc)
	}
	var got []string
	for _, id := range []uint32{ida, idc} {
		u, _ := e.WorkerURL(id)
		got = append(got, u)
	}
	if !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("urls %v", got)
	}
}
