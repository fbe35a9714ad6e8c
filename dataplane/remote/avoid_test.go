package remote

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/cartrouter/cart/dataplane/router"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// The avoid list travels to the leader, and its verdict comes back.
func TestAvoidViaControlPlane(t *testing.T) {
	cp := newFakeCP(t)
	cp.set(func(f *fakeCP) {
		f.routeFn = func(*cartv1.RouteRequest) *cartv1.RouteResponse {
			return &cartv1.RouteResponse{Worker: wA, Reason: "cache_miss", FromLeader: true, AvoidIgnored: true}
		}
	})
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot})
	d, err := r.Decide(context.Background(), &router.Request{Avoid: []string{wA, wB}, DryRun: true})
	if err != nil || !d.AvoidIgnored {
		t.Fatalf("decision %+v, %v; want avoid_ignored passed on", d, err)
	}
	if got := cp.lastRoute().GetAvoidWorkers(); !slices.Equal(got, []string{wA, wB}) {
		t.Fatalf("avoid_workers sent = %v", got)
	}
}

// The local fallback keeps avoided workers out like the leader does:
// unless nobody else is usable, and then it says so.
func TestFallbackHonoursAvoid(t *testing.T) {
	r := newTestRouter(t, Options{BootWorkers: []router.WorkerStatus{
		{URL: wA, Healthy: true},
		{URL: wB, Healthy: true, LoadPenalty: 5},
		{URL: wC, Healthy: false},
	}})
	route := func(exclude, avoid []string) (router.Decision, error) {
		return r.Decide(context.Background(), &router.Request{Exclude: exclude, Avoid: avoid, DryRun: true})
	}
	if d, err := route(nil, []string{wA}); err != nil || d.Worker != wB || d.AvoidIgnored {
		t.Fatalf("A avoided: %+v %v; want B, not a trial", d, err)
	}
	if d, err := route(nil, []string{wA, wB}); err != nil || d.Worker != wA || !d.AvoidIgnored {
		t.Fatalf("all avoided: %+v %v; want a trial on A (least loaded)", d, err)
	}
	if d, err := route([]string{wA}, []string{wB}); err != nil || d.Worker != wB || !d.AvoidIgnored {
		t.Fatalf("A excluded, B avoided: %+v %v; want a trial on B", d, err)
	}
	if _, err := route([]string{wA, wB}, []string{wC}); !errors.Is(err, router.ErrUnavailable) {
		t.Fatalf("only an unhealthy worker avoided: err = %v, want unavailable", err)
	}
}
