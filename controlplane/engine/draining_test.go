package engine

import (
	"errors"
	"testing"
)

func TestDrainingWorkerGetsNoNewRequests(t *testing.T) {
	e := newTestEngine(t, testPolicy(), urls("a", "b")...)
	d, err := e.Choose(Request{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	first := d.Worker
	e.SetDraining(first, true)
	for i := range 20 {
		d, err := e.Choose(Request{}, int64(i+2))
		if err != nil {
			t.Fatal(err)
		}
		if d.Worker == first {
			t.Fatalf("request %d went to draining worker %s", i, first)
		}
		e.Release(d.Worker)
	}
	// The draining worker keeps its in-flight load until the request ends.
	if got := e.Load(first); got != 1 {
		t.Fatalf("draining worker load = %d, want 1", got)
	}
	var ws WorkerState
	for _, w := range e.Workers() {
		if w.URL == first {
			ws = w
		}
	}
	if !ws.Draining {
		t.Fatalf("Workers() does not report %s draining", first)
	}
	e.Release(first)
	e.SetDraining(first, false)
	seen := false
	for i := range 20 {
		d, _ := e.Choose(Request{}, int64(100+i))
		seen = seen || d.Worker == first
		e.Release(d.Worker)
	}
	if !seen {
		t.Fatalf("undrained worker %s never chosen again", first)
	}
}

func TestAllDrainingIsNoHealthy(t *testing.T) {
	e := newTestEngine(t, testPolicy(), urls("a")...)
	e.SetDraining("a", true)
	if _, err := e.Choose(Request{}, 1); !errors.Is(err, ErrNoHealthy) {
		t.Fatalf("err = %v, want ErrNoHealthy", err)
	}
}
