package router

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
)

func newTestLocal(workers ...string) *Local {
	var specs []engine.WorkerSpec
	for _, w := range workers {
		specs = append(specs, engine.WorkerSpec{URL: w})
	}
	return NewLocal(LocalOptions{
		Policy:      engine.Policy{Threshold: 0.3, BalanceAbsThreshold: 64, BalanceRelThreshold: 1.5, BlockChars: 4},
		MaxEntries:  1000,
		CleanupHour: -1,
		Seed:        1,
	}, specs)
}

func request(text string) *Request {
	return &Request{Hashes: index.Hash(nil, "m", []byte(text), 4), KeyLen: len(text)}
}

// Done settles the decision it is handed back, and refuses (counting it)
// one this router did not make, instead of ignoring it.
func TestLocalDoneSettlesOnlyItsOwnTickets(t *testing.T) {
	l := newTestLocal("a")
	d, err := l.Decide(context.Background(), request("a prompt"))
	if err != nil {
		t.Fatal(err)
	}
	if l.Load("a") != 1 {
		t.Fatalf("load after Route = %d", l.Load("a"))
	}
	l.Done(Decision{Worker: "a", Ticket: Ticket{ID: 3, Worker: "a"}}, Outcome{Delivered: true})
	if l.Load("a") != 1 || rejected(t, l) != 1 {
		t.Fatalf("a foreign ticket: load %d, rejected %v", l.Load("a"), rejected(t, l))
	}
	l.Done(d, Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1})
	if l.Load("a") != 0 || rejected(t, l) != 1 {
		t.Fatalf("its own ticket: load %d, rejected %v", l.Load("a"), rejected(t, l))
	}
}

// Capacity errors reach the proxy as ErrUnavailable (a 503), with the
// engine's own message.
func TestLocalCapacityErrorsAreUnavailable(t *testing.T) {
	l := newTestLocal()
	_, err := l.Decide(context.Background(), request("x"))
	if !errors.Is(err, ErrUnavailable) || err.Error() != engine.ErrNoWorkers.Error() {
		t.Fatalf("err = %v", err)
	}
}

func rejected(t *testing.T, l *Local) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(l.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "cart_decider_rejected_tickets_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("cart_decider_rejected_tickets_total not exported")
	return 0
}
