package decider

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/engine"
)

func splitDecider(t *testing.T, decodeConc int) *Decider {
	t.Helper()
	d := New(Options{Policy: engine.Policy{Threshold: 0.3, BalanceAbsThreshold: 64, BalanceRelThreshold: 1.5, BlockChars: 4}, MaxEntries: 10000})
	d.SetWorkers([]engine.WorkerSpec{{URL: "p", Role: engine.RolePrefill}, {URL: "d", Role: engine.RoleDecode, MaxConcurrency: decodeConc}})
	return d
}

func pairReq(text string) Request {
	r := req(text)
	r.Disagg = engine.DisaggPair
	return r
}

func loads(d *Decider) map[string]int {
	out := map[string]int{}
	for _, w := range d.Workers() {
		out[w.URL] = w.Load
	}
	return out
}

// A split decision has two tickets, one per leg, each settled on its own:
// the prefill leg's when its answer is in, the decode leg's at the end.
// An undelivered prefill withdraws the prompt's placement.
func TestSplitDecisionSettlesEachLeg(t *testing.T) {
	d := splitDecider(t, 0)
	dec, err := d.Decide(pairReq("a prompt long enough to place"))
	if err != nil || !dec.Split() || dec.Reason != engine.ReasonPD {
		t.Fatalf("%+v %v", dec, err)
	}
	if dec.PrefillTicket.Worker != "p" || dec.Ticket.Worker != "d" || len(dec.PrefillTicket.placed) == 0 {
		t.Fatalf("tickets %+v / %+v", dec.PrefillTicket, dec.Ticket)
	}
	if l := loads(d); l["p"] != 1 || l["d"] != 1 {
		t.Fatalf("loads %v", l)
	}
	if err := d.Settle(dec.PrefillTicket, Outcome{Delivered: false, PromptTokens: -1, CachedTokens: -1}); err != nil {
		t.Fatal(err)
	}
	if l := loads(d); l["p"] != 0 || l["d"] != 1 {
		t.Fatalf("after the prefill leg: %v", l)
	}
	again, _ := d.Decide(pairReq("a prompt long enough to place"))
	if again.Prefill.Reason != engine.ReasonCacheMiss {
		t.Fatalf("an undelivered prefill left its placement: %s", again.Prefill.Reason)
	}
	for _, tk := range []Ticket{dec.Ticket, again.Ticket, again.PrefillTicket} {
		if err := d.Settle(tk, Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1}); err != nil {
			t.Fatal(err)
		}
	}
	if l := loads(d); l["p"] != 0 || l["d"] != 0 {
		t.Fatalf("at the end: %v", l)
	}
	if _, u := d.IndexStats(); u != 0 {
		t.Fatalf("underflows %d", u)
	}
}

// A pair waits in the queue while the decode side is saturated, and a
// waiter that leaves after its dispatch gives both legs back.
func TestSplitDecisionWaitsForADecodeSlot(t *testing.T) {
	d := splitDecider(t, 1)
	first, err := d.Admit(context.Background(), pairReq("first prompt"), Admission{Tenant: "t"})
	if err != nil || !first.Split() {
		t.Fatalf("%+v %v", first, err)
	}
	out := make(chan admitResult, 1)
	queued := make(chan struct{})
	go func() {
		dec, err := d.Admit(context.Background(), pairReq("second prompt"), Admission{Tenant: "t", OnQueued: func() { close(queued) }})
		out <- admitResult{"second", dec, err}
	}()
	select {
	case <-queued:
	case <-time.After(5 * time.Second):
		t.Fatal("the second pair did not wait for the saturated decode worker")
	}
	if l := loads(d); l["p"] != 1 || l["d"] != 1 {
		t.Fatalf("a waiting pair took load: %v", l)
	}
	settleOK(t, d, first)
	if err := d.Settle(first.PrefillTicket, Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1}); err != nil {
		t.Fatal(err)
	}
	r := result(t, out)
	if r.err != nil || !r.dec.Split() {
		t.Fatalf("%+v %v", r.dec, r.err)
	}
	d.mu.Lock()
	d.undo(nil, r.dec)
	d.mu.Unlock()
	if l := loads(d); l["p"] != 0 || l["d"] != 0 {
		t.Fatalf("undo left load: %v", l)
	}
}

// A leader's split decision is two tracked tickets under one route id: an
// abandon report settles both, a Sync's fence counts both of an open
// call, and each leg's completion releases its own worker.
func TestTrackedSplitDecision(t *testing.T) {
	now := time.Unix(1000, 0)
	d := New(Options{Policy: engine.Policy{Threshold: 0.3, BalanceAbsThreshold: 64, BalanceRelThreshold: 1.5, BlockChars: 4}, MaxEntries: 10000,
		Now: func() time.Time { return now }})
	d.SetWorkers([]engine.WorkerSpec{{URL: "p", Role: engine.RolePrefill}, {URL: "d", Role: engine.RoleDecode}})
	d.Lead(true)
	d.SyncLoads("x", 0, map[string]int{}, 0, SyncFence{FirstRouteID: 1, SyncSeq: 1, LastRouteID: 9})
	call := func(route uint64) Decision {
		t.Helper()
		dec, err := d.DecideFor(context.Background(), Caller{DataPlane: "x", RouteID: route}, pairReq("prompt of call"+string(rune('a'+route))))
		if err != nil || !dec.Split() || dec.Ticket.ID == 0 || dec.PrefillTicket.ID == 0 || dec.Ticket.ID == dec.PrefillTicket.ID {
			t.Fatalf("%+v %v", dec, err)
		}
		return dec
	}
	abandoned := call(10)
	if n := d.Complete("x", []Completion{{Abandoned: true, RouteID: 10}}); n != 1 {
		t.Fatalf("abandon settled %d", n)
	}
	if l := loads(d); l["p"] != 0 || l["d"] != 0 {
		t.Fatalf("an abandoned pair kept load: %v", l)
	}
	if n := d.Complete("x", []Completion{{Ticket: abandoned.PrefillTicket.ID, Worker: "p"}}); n != 0 {
		t.Fatal("the abandoned pair's prefill ticket was still live")
	}

	open := call(11)
	// The counts are taken while call 11's answer is on its way: the
	// fence adds both its legs back.
	d.SyncLoads("x", 0, map[string]int{}, 0, SyncFence{FirstRouteID: 1, SyncSeq: 2, LastRouteID: 11, OpenRoutes: []uint64{11}})
	if l := loads(d); l["p"] != 1 || l["d"] != 1 {
		t.Fatalf("after a Sync fencing the open pair: %v", l)
	}
	if n := d.Complete("x", []Completion{{Ticket: open.PrefillTicket.ID, Worker: "p", DoneSeq: 1, Outcome: Outcome{Delivered: true}}}); n != 1 {
		t.Fatal("prefill completion did not settle")
	}
	if l := loads(d); l["p"] != 0 || l["d"] != 1 {
		t.Fatalf("after the prefill leg: %v", l)
	}
	if n := d.Complete("x", []Completion{{Ticket: open.Ticket.ID, Worker: "d", DoneSeq: 2, Outcome: Outcome{Delivered: true}}}); n != 1 {
		t.Fatal("decode completion did not settle")
	}
	// A Sync whose counts were taken before both reports finished (both
	// still counted, done_seq 0) while the leader settled them already.
	d.SyncLoads("x", 0, map[string]int{"p": 1, "d": 1}, 0, SyncFence{FirstRouteID: 1, SyncSeq: 3, LastRouteID: 11, DoneSeq: 0})
	if l := loads(d); l["p"] != 0 || l["d"] != 0 {
		t.Fatalf("a Sync older than both reports: %v", l)
	}
	if d.Stats().Unsettled != 0 {
		t.Fatalf("%d tickets left", d.Stats().Unsettled)
	}
}

// A pinned request goes whole to its worker, whatever its role.
func TestPinnedSplitRequestGoesWhole(t *testing.T) {
	d := splitDecider(t, 0)
	r := pairReq("a continuation")
	r.PinTo = "d"
	dec, err := d.Decide(r)
	if err != nil || dec.Split() || dec.Worker != "d" || !dec.Pinned {
		t.Fatalf("%+v %v", dec, err)
	}
	settleOK(t, d, dec)
	if _, err := d.Decide(func() Request { r := req("x"); r.PinTo = "p"; return r }()); err != nil {
		t.Fatalf("pinned to a prefill worker: %v", err)
	}
	if _, err := d.Decide(func() Request { r := pairReq("x"); r.Exclude = []string{"p", "d"}; return r }()); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("every worker excluded: %v", err)
	}
}

// Only the prefill leg's usage measures the prediction: the decode leg
// pulls the prompt's blocks, so what it reports cached says nothing of
// the cache CART predicted on it.
func TestDecodeLegUsageStaysOutOfTheClosedLoop(t *testing.T) {
	d := splitDecider(t, 0)
	dec, err := d.Decide(pairReq("a prompt long enough to place"))
	if err != nil || !dec.Split() {
		t.Fatalf("%+v %v", dec, err)
	}
	usage := Outcome{Delivered: true, PromptTokens: 40, CachedTokens: 40}
	for _, tk := range []Ticket{dec.PrefillTicket, dec.Ticket} {
		if err := d.Settle(tk, usage); err != nil {
			t.Fatal(err)
		}
	}
	reports := map[string]uint64{}
	for _, w := range d.Workers() {
		reports[w.URL] = w.Accuracy.Reports
	}
	if reports["p"] != 1 || reports["d"] != 0 {
		t.Fatalf("usage reports counted %v, want the prefill worker's only", reports)
	}
}
