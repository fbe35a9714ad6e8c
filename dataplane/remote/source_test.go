package remote

import (
	"context"
	"testing"

	"github.com/cartrouter/cart/dataplane/router"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// A decision carries its worker's source, which decides whether the pool's
// worker key goes along: the one the leader names; from a leader that
// predates worker_source, the one this data plane last synced (boot
// workers are static); router.SourceUnknown when neither knows. Local
// fallback decisions take it from the synced set too.
func TestDecisionCarriesWorkerSource(t *testing.T) {
	cp := newFakeCP(t)
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: []router.WorkerStatus{
		{URL: wA, Healthy: true, Source: "static"},
		{URL: wB, Healthy: true, Source: "dns"},
	}})
	route := func(worker, source string) router.Decision {
		t.Helper()
		cp.set(func(f *fakeCP) {
			f.routeFn = func(*cartv1.RouteRequest) *cartv1.RouteResponse {
				return &cartv1.RouteResponse{Worker: worker, Reason: "cache_miss", FromLeader: true, WorkerSource: source}
			}
		})
		d, err := r.Decide(context.Background(), &router.Request{DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for _, tc := range []struct{ worker, named, want string }{
		{wB, "kubernetes", "kubernetes"}, // the leader's word wins
		{wA, "", "static"},               // an older leader: as synced
		{wB, "", "dns"},
		{wC, "", router.SourceUnknown}, // not synced yet
	} {
		if d := route(tc.worker, tc.named); d.Source != tc.want {
			t.Errorf("leader chose %s naming source %q: decision source %q, want %q", tc.worker, tc.named, d.Source, tc.want)
		}
	}

	local := newTestRouter(t, Options{BootWorkers: []router.WorkerStatus{{URL: wB, Healthy: true, Source: "dns"}}})
	d, err := local.Decide(context.Background(), &router.Request{DryRun: true})
	if err != nil || d.Reason != ReasonFallbackLocal || d.Source != "dns" {
		t.Fatalf("local fallback: %+v, %v; want dns", d, err)
	}
}
