package remote

import (
	"context"
	"testing"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/dataplane/router"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

var splitSync = &cartv1.SyncResponse{WorkersVersion: 1, Workers: []*cartv1.Worker{
	{Url: wA, Healthy: true, Role: "prefill", Source: "dns"}, {Url: wB, Healthy: true, Role: "prefill", Source: "kubernetes"},
	{Url: wC, Healthy: true, Role: "decode"}, {Url: wD, Healthy: true, Role: "decode"},
}}

// A leader's split answer: both legs, each with its ticket, counted in
// flight from the answer on, each released and reported by its own Done;
// the call asked for a pair.
func TestRouteSplitAnswer(t *testing.T) {
	f := newFakeCP(t)
	f.set(func(f *fakeCP) {
		f.syncResp = splitSync
		f.routeFn = func(req *cartv1.RouteRequest) *cartv1.RouteResponse {
			if req.GetDryRun() {
				// A leader that predates worker_source on prefill legs.
				return &cartv1.RouteResponse{Worker: wC, Reason: "pd", FromLeader: true, Prefill: &cartv1.PrefillLeg{Worker: wB}}
			}
			return &cartv1.RouteResponse{Worker: wC, Reason: "pd", FromLeader: true, Ticket: 20, WorkerSource: "admin",
				Prefill: &cartv1.PrefillLeg{Worker: wA, Ticket: 21, Reason: "cache_hit", ChosenChars: 64, WorkerSource: "static"}}
		}
	})
	r := newTestRouter(t, Options{ControlPlanes: []string{f.url}})
	if err := r.SyncOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	d, err := r.Decide(context.Background(), &router.Request{Hashes: []uint64{1, 2}, KeyLen: 128, Disagg: engine.DisaggPair})
	if err != nil {
		t.Fatal(err)
	}
	if f.lastRoute().GetDisaggregation() != cartv1.Disaggregation_DISAGGREGATION_PAIR {
		t.Fatalf("asked %v", f.lastRoute().GetDisaggregation())
	}
	if d.Prefill == nil || d.Prefill.Worker != wA || d.Prefill.Ticket.ID != 21 || d.Ticket.ID != 20 || d.Worker != wC {
		t.Fatalf("%+v / %+v", d, d.Prefill)
	}
	if d.Prefill.Source != "static" || d.Source != "admin" {
		t.Fatalf("sources: prefill %q, decode %q; want the leader's", d.Prefill.Source, d.Source)
	}
	dry, err := r.Decide(context.Background(), &router.Request{Hashes: []uint64{1, 2}, KeyLen: 128, Disagg: engine.DisaggPair, DryRun: true})
	if err != nil || dry.Prefill == nil || dry.Prefill.Source != "kubernetes" {
		t.Fatalf("an answer without the prefill worker's source: %+v, %v; want it from the synced set", dry.Prefill, err)
	}
	if loadOf(r, wA) != 1 || loadOf(r, wC) != 1 {
		t.Fatalf("in flight: %s %d, %s %d", wA, loadOf(r, wA), wC, loadOf(r, wC))
	}
	r.Done(*d.Prefill, router.Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1})
	if loadOf(r, wA) != 0 || loadOf(r, wC) != 1 {
		t.Fatal("the prefill leg's Done did not release its own worker only")
	}
	r.Done(d, router.Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1})
	if loadOf(r, wC) != 0 {
		t.Fatal("decode leg not released")
	}
	r.mu.Lock()
	pending := r.pending.len()
	r.mu.Unlock()
	if pending != 2 {
		t.Fatalf("%d reports queued, want one per leg", pending)
	}
}

// With no control plane the data plane splits a request itself, by the
// engine's rules over its own counts: a prefill worker (by its shadow
// index) and the least-loaded decode worker; a whole request never goes
// to a prefill worker; a decode leg alone goes to a decode worker.
func TestFallbackSplits(t *testing.T) {
	var boot []router.WorkerStatus
	for _, w := range splitSync.GetWorkers() {
		role, _ := engine.ParseRole(w.GetRole())
		boot = append(boot, router.WorkerStatus{URL: w.GetUrl(), Healthy: true, Role: role})
	}
	r := newTestRouter(t, Options{ControlPlanes: []string{downURL(t)}, BootWorkers: boot, Shadow: ShadowOptions{Entries: 1024, Threshold: 0.3, BalanceAbs: 64, BalanceRel: 1.5}, BlockChars: 64})
	ctx := context.Background()
	first, err := r.Decide(ctx, &router.Request{Hashes: []uint64{7, 8, 9}, KeyLen: 192, Disagg: engine.DisaggPair})
	if err != nil || first.Prefill == nil || first.Reason != ReasonFallbackLocal {
		t.Fatalf("%+v %v", first, err)
	}
	if (first.Prefill.Worker != wA && first.Prefill.Worker != wB) || (first.Worker != wC && first.Worker != wD) {
		t.Fatalf("pair %s/%s", first.Prefill.Worker, first.Worker)
	}
	second, _ := r.Decide(ctx, &router.Request{Hashes: []uint64{7, 8, 9}, KeyLen: 192, Disagg: engine.DisaggPair})
	if second.Prefill.Worker != first.Prefill.Worker || second.Worker == first.Worker {
		t.Fatalf("second pair %s/%s after %s/%s: want the same prefill worker (shadow), the other decode worker (load)",
			second.Prefill.Worker, second.Worker, first.Prefill.Worker, first.Worker)
	}
	whole, _ := r.Decide(ctx, &router.Request{KeyLen: 0})
	if whole.Worker != wC && whole.Worker != wD {
		t.Fatalf("a whole request went to %s", whole.Worker)
	}
	dec, _ := r.Decide(ctx, &router.Request{Disagg: engine.DisaggDecode, Exclude: []string{wC}})
	if dec.Worker != wD || dec.Prefill != nil {
		t.Fatalf("decode leg %+v", dec)
	}
	for _, d := range []router.Decision{first, *first.Prefill, second, *second.Prefill, whole, dec} {
		r.Done(d, router.Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1})
	}
	for _, w := range []string{wA, wB, wC, wD} {
		if n := loadOf(r, w); n != 0 {
			t.Fatalf("%s load %d after every Done", w, n)
		}
	}
}
