package decider

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
)

func newTestDecider(now *time.Time, maxEntries, hour int) *Decider {
	d := New(Options{
		Policy:       engine.Policy{Threshold: 0.3, BalanceAbsThreshold: 64, BalanceRelThreshold: 1.5, BlockChars: 4},
		MaxEntries:   maxEntries,
		DailyReset:   hour >= 0,
		ResetHourUTC: hour,
		Now:          func() time.Time { return *now },
	})
	d.SetWorkers([]engine.WorkerSpec{{URL: "a"}, {URL: "b"}})
	return d
}

func req(text string) Request {
	return Request{Request: engine.Request{Hashes: index.Hash(nil, "m", []byte(text), 4), KeyLen: len(text)}}
}

// route decides and settles text as delivered.
func route(t *testing.T, d *Decider, text string) Decision {
	t.Helper()
	dec, err := d.Decide(req(text))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Settle(dec.Ticket, Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1}); err != nil {
		t.Fatal(err)
	}
	return dec
}

// holdCount is how many lock holds were recorded for op.
func holdCount(t *testing.T, d *Decider, op Op) uint64 {
	t.Helper()
	var m dto.Metric
	if err := d.hold.vec.WithLabelValues(op.String()).(prometheus.Histogram).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

func TestSettleReleasesAndWithdraws(t *testing.T) {
	now := time.Unix(1000, 0)
	d := newTestDecider(&now, 1000, -1)
	dec, err := d.Decide(req("a prompt to be withdrawn"))
	if err != nil {
		t.Fatal(err)
	}
	if d.Load(dec.Worker) != 1 || len(dec.Ticket.placed) == 0 {
		t.Fatalf("after Route: load %d, placed %d blocks", d.Load(dec.Worker), len(dec.Ticket.placed))
	}
	if err := d.Settle(dec.Ticket, Outcome{Delivered: false, PromptTokens: -1, CachedTokens: -1}); err != nil {
		t.Fatal(err)
	}
	if d.Load(dec.Worker) != 0 {
		t.Fatalf("load after settling = %d", d.Load(dec.Worker))
	}
	if st, _ := d.IndexStats(); st.Entries != 0 {
		t.Fatalf("undelivered placement kept: %d entries", st.Entries)
	}
}

// A ticket the decider did not issue is refused and counted, and changes
// nothing: a wrong ticket is never a silent no-op.
func TestSettleRefusesForeignTickets(t *testing.T) {
	now := time.Unix(1000, 0)
	d, other := newTestDecider(&now, 1000, -1), newTestDecider(&now, 1000, -1)
	dec, err := d.Decide(req("some prompt"))
	if err != nil {
		t.Fatal(err)
	}
	for name, tk := range map[string]Ticket{
		"zero":    {},
		"remote":  {ID: 7, Worker: dec.Worker},
		"foreign": func() Ticket { o, _ := other.Decide(req("x")); return o.Ticket }(),
	} {
		if err := d.Settle(tk, Outcome{Delivered: true}); !errors.Is(err, ErrForeignTicket) {
			t.Fatalf("%s ticket: err = %v", name, err)
		}
	}
	if got := d.Rejected(); got != 3 {
		t.Fatalf("rejected = %d, want 3", got)
	}
	if d.Load(dec.Worker) != 1 {
		t.Fatalf("a refused settlement changed the load: %d", d.Load(dec.Worker))
	}
}

func TestCapacityErrorsAreMarked(t *testing.T) {
	now := time.Unix(1000, 0)
	d := New(Options{Policy: engine.Policy{BlockChars: 4}, MaxEntries: 100, Now: func() time.Time { return now }})
	_, err := d.Decide(req("x"))
	if !errors.Is(err, ErrNoCapacity) || !errors.Is(err, engine.ErrNoWorkers) {
		t.Fatalf("no workers: %v", err)
	}
	d.SetWorkers([]engine.WorkerSpec{{URL: "a"}})
	r := req("x")
	r.Exclude = []string{"a"}
	if _, err := d.Decide(r); !errors.Is(err, ErrNoCapacity) || !errors.Is(err, engine.ErrAllExcluded) {
		t.Fatalf("all excluded: %v", err)
	}
}

// Every critical section is timed: after a route the op=route count is
// positive, and the histogram is what the hosts register.
func TestLockHoldIsRecorded(t *testing.T) {
	now := time.Unix(1000, 0)
	d := newTestDecider(&now, 1000, -1)
	route(t, d, "time me")
	if n := holdCount(t, d, OpRoute); n != 1 {
		t.Fatalf("op=route holds = %d, want 1", n)
	}
	if n := holdCount(t, d, OpSettle); n != 1 {
		t.Fatalf("op=settle holds = %d, want 1", n)
	}
	d.Do(OpSnapshotCapture, func(*engine.Engine) {})
	if n := holdCount(t, d, OpSnapshotCapture); n != 1 {
		t.Fatalf("op=snapshot_capture holds = %d, want 1", n)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(d.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "cart_decider_lock_hold_seconds" {
			found = true
			for _, m := range mf.GetMetric() {
				if b := m.GetHistogram().GetBucket(); len(b) == 0 || b[0].GetUpperBound() > 1e-5 {
					t.Fatalf("first bucket %v: want sub-millisecond resolution from 10µs", b)
				}
			}
		}
	}
	if !found {
		t.Fatal("cart_decider_lock_hold_seconds not exported")
	}
}

func TestPinnedRouting(t *testing.T) {
	now := time.Unix(1000, 0)
	d := newTestDecider(&now, 1000, -1)
	r := req("continue my response")
	r.PinTo = "b"
	for range 3 {
		dec, err := d.Decide(r)
		if err != nil || dec.Worker != "b" || !dec.Pinned {
			t.Fatalf("pinned decision: %v, %+v", err, dec)
		}
	}
	r.PinTo = "gone"
	var pg *PinnedGoneError
	if _, err := d.Decide(r); !errors.As(err, &pg) || pg.Worker != "gone" {
		t.Fatalf("pinned to a removed worker: %v", err)
	}
}

// A leader's tracked decision undone when its caller gave up keeps
// nothing: no load, no placement, no ticket, one abandoned drop.
func TestRouteForUndoesAfterDeadline(t *testing.T) {
	now := time.Unix(1000, 0)
	d := newTestDecider(&now, 1000, -1)
	if _, err := d.DecideFor(context.Background(), Caller{DataPlane: "dp"}, req("x")); !errors.Is(err, ErrNotLeading) {
		t.Fatalf("before Lead: %v", err)
	}
	d.Lead(true)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := d.DecideFor(ctx, Caller{DataPlane: "dp", RouteID: 1}, req("a prompt nobody waits for")); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	st := d.Stats()
	if d.Load("a")+d.Load("b") != 0 || st.IndexEntries != 0 || st.Unsettled != 0 || d.Dropped(DropAbandoned) != 1 {
		t.Fatalf("after an abandoned decision: load %d, %+v, abandoned %d", d.Load("a")+d.Load("b"), st, d.Dropped(DropAbandoned))
	}
	// A stream call's timeout (Caller.Expired) undoes it the same way,
	// with the context still live.
	expired := func() bool { return true }
	if _, err := d.DecideFor(context.Background(), Caller{DataPlane: "dp", RouteID: 2, Expired: expired}, req("another prompt nobody waits for")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("expired caller: err = %v", err)
	}
	st = d.Stats()
	if d.Load("a")+d.Load("b") != 0 || st.IndexEntries != 0 || st.Unsettled != 0 || d.Dropped(DropAbandoned) != 2 {
		t.Fatalf("after an expired decision: load %d, %+v, abandoned %d", d.Load("a")+d.Load("b"), st, d.Dropped(DropAbandoned))
	}
	// One still waited for is kept.
	waiting := func() bool { return false }
	if _, err := d.DecideFor(context.Background(), Caller{DataPlane: "dp", RouteID: 3, Expired: waiting}, req("a prompt someone waits for")); err != nil {
		t.Fatal(err)
	}
	if d.Load("a")+d.Load("b") != 1 || d.Stats().Unsettled != 1 {
		t.Fatalf("after a decision in time: load %d, %+v", d.Load("a")+d.Load("b"), d.Stats())
	}
}
