package remote

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/index"
	"github.com/cartrouter/cart/controlplane/service"
	"github.com/cartrouter/cart/dataplane/router"
	"github.com/cartrouter/cart/internal/testkit"
)

// With the placement feed, a data plane's fallback knows where the leader
// sent another data plane's prompt; without it, only its own.
func TestFallbackKnowsOtherDataPlanesPlacements(t *testing.T) {
	cp := newOneNodeCP(t, service.AuthOptions{Token: "tok"})
	shadow := ShadowOptions{Entries: 1 << 12, Threshold: 0.3, BalanceAbs: 4, BalanceRel: 1.5}
	newDP := func(id string, feed bool) *Router {
		r := newTestRouter(t, Options{ID: id, ControlPlanes: []string{cp.url}, Token: "tok", RouteStream: true, PlacementFeed: feed,
			BlockChars: 64, Shadow: shadow, FlushInterval: 5 * time.Millisecond})
		run(t, r)
		streamLive(t, r, cp.url)
		if err := r.SyncOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		return r
	}
	fed, unfed, other := newDP("dp-fed", true), newDP("dp-unfed", false), newDP("dp-other", false)
	testkit.WaitFor(t, 5*time.Second, "the feed's reader", func() bool { return fed.streams.fed() })
	hashes := func(s string) []uint64 { return index.Hash(nil, "m", []byte(s), 64) }
	prompt := strings.Repeat("a system prompt that only dp-other has sent so far. ", 20)
	req := &router.Request{Model: "m", Hashes: hashes(prompt), KeyLen: len(prompt)}
	d, err := other.Route(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	other.Done(d, router.Outcome{Delivered: true})
	next := &router.Request{Model: "m", Hashes: hashes(prompt + " and a follow-up question"), KeyLen: len(prompt) + 25}
	testkit.WaitFor(t, 5*time.Second, "the placement fed to dp-fed", func() bool {
		got, err := fed.fallback(&router.Request{Model: "m", Hashes: next.Hashes, KeyLen: next.KeyLen, DryRun: true})
		return err == nil && got.Candidate == d.Worker
	})
	got, err := unfed.fallback(&router.Request{Model: "m", Hashes: next.Hashes, KeyLen: next.KeyLen, DryRun: true})
	if err != nil || got.Candidate != "" {
		t.Fatalf("a data plane without the feed matched another's prompt: %+v, %v", got, err)
	}
}
