package remote

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/service"
	"github.com/cartrouter/cart/dataplane/router"
)

// A stored response belongs to the tenant that produced it, across data
// planes: what one data plane reported, a real leader refuses to another
// tenant asking through another data plane, over the stream and in a
// unary call alike, and pins for its own tenant.
func TestStoredResponseOfAnotherTenant(t *testing.T) {
	cp := newOneNodeCP(t, service.AuthOptions{Token: "tok"})
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			maker := newTestRouter(t, Options{ID: "dp-maker", ControlPlanes: []string{cp.url}, Token: "tok", RouteStream: stream, FlushInterval: 5 * time.Millisecond})
			asker := newTestRouter(t, Options{ID: "dp-asker", ControlPlanes: []string{cp.url}, Token: "tok", RouteStream: stream, FlushInterval: 5 * time.Millisecond})
			for _, r := range []*Router{maker, asker} {
				run(t, r)
				if stream {
					streamLive(t, r, cp.url)
				}
				if err := r.SyncOnce(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			id := "resp_" + fmt.Sprint(stream)
			maker.LearnResponse(context.Background(), id, wB, "team-a")

			_, err := asker.Decide(context.Background(), &router.Request{Model: "m", ResponseID: id, Tenant: "team-b"})
			if !errors.Is(err, router.ErrResponseNotFound) {
				t.Fatalf("another tenant's response: %v, want router.ErrResponseNotFound", err)
			}
			d, err := asker.Decide(context.Background(), &router.Request{Model: "m", ResponseID: id, Tenant: "team-a"})
			if err != nil || !d.Pinned || d.Worker != wB {
				t.Fatalf("the owner's request: %+v %v, want pinned to %s", d, err, wB)
			}
			asker.Done(d, router.Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1})
		})
	}
}
