package service

import (
	"fmt"
	"testing"

	"connectrpc.com/connect"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// The leader keeps avoid_workers out while others can take the request,
// and decides a trial on them (avoid_ignored) when nobody else can.
func TestRouteAvoidWorkers(t *testing.T) {
	_, rc := leaderWith(t, w1, w2)
	for range 5 {
		got := route(t, rc, &cartv1.RouteRequest{Model: "m", Text: text(100, 3), AvoidWorkers: []string{w1}, DryRun: true})
		if got.GetWorker() != w2 || got.GetAvoidIgnored() {
			t.Fatalf("w1 avoided: %v", got)
		}
	}
	got := route(t, rc, &cartv1.RouteRequest{Model: "m", Text: text(100, 3), ExcludeWorkers: []string{w2}, AvoidWorkers: []string{w1}, DryRun: true})
	if got.GetWorker() != w1 || !got.GetAvoidIgnored() {
		t.Fatalf("w2 excluded, w1 avoided: %v; want a trial on w1", got)
	}
}

// The lists a caller may name are bounded: the engine walks them for every
// candidate under the routing lock.
func TestRouteListedWorkersBounded(t *testing.T) {
	_, rc := leaderWith(t, w1, w2)
	names := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("http://w%d.test", i)
		}
		return out
	}
	half := maxListedWorkers / 2
	route(t, rc, &cartv1.RouteRequest{Model: "m", Text: text(100, 3), ExcludeWorkers: names(half), AvoidWorkers: names(maxListedWorkers - half), DryRun: true})
	_, err := rc.Route(t.Context(), connect.NewRequest(&cartv1.RouteRequest{Model: "m", Text: text(100, 3), ExcludeWorkers: names(half), AvoidWorkers: names(maxListedWorkers - half + 1), DryRun: true}))
	wantCode(t, err, connect.CodeInvalidArgument)
}
