package remote

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/index"
	"github.com/cartrouter/cart/controlplane/service"
	"github.com/cartrouter/cart/dataplane/router"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
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
	d, err := other.Decide(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	other.Done(d, router.Outcome{Delivered: true})
	next := &router.Request{Model: "m", Hashes: hashes(prompt + " and a follow-up question"), KeyLen: len(prompt) + 25}
	testkit.WaitFor(t, 5*time.Second, "the placement fed to dp-fed", func() bool {
		got, err := fed.fallback(context.Background(), &router.Request{Model: "m", Hashes: next.Hashes, KeyLen: next.KeyLen, DryRun: true})
		return err == nil && got.Candidate == d.Worker
	})
	got, err := unfed.fallback(context.Background(), &router.Request{Model: "m", Hashes: next.Hashes, KeyLen: next.KeyLen, DryRun: true})
	if err != nil || got.Candidate != "" {
		t.Fatalf("a data plane without the feed matched another's prompt: %+v, %v", got, err)
	}
}

// A leader that predates the feed answers the hello without the empty
// placements frame: the data plane then keeps recording its own answers,
// or its shadow would stay empty through a rolling upgrade.
func TestFeedNotAcknowledgedKeepsOwnAnswers(t *testing.T) {
	cp, _ := newStreamCP(t)
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, RouteStream: true, PlacementFeed: true, BlockChars: 16,
		Shadow: testShadow, BootWorkers: []router.WorkerStatus{{URL: wA, Healthy: true}, {URL: wB, Healthy: true}}})
	run(t, r)
	streamLive(t, r, cp.url)
	if r.streams.fed() {
		t.Fatal("the feed counted as live without the leader's acknowledgement")
	}
	prompt := "a prompt only this data plane has sent, several blocks long"
	d, err := r.Decide(context.Background(), &router.Request{Model: "m", Hashes: keyHashes(prompt), KeyLen: len(prompt)})
	if err != nil || d.Reason == ReasonFallbackLocal {
		t.Fatalf("Route = %+v, %v", d, err)
	}
	got, err := r.fallback(context.Background(), &router.Request{Model: "m", Hashes: keyHashes(prompt + " next"), KeyLen: len(prompt) + 5, DryRun: true})
	if err != nil || got.Candidate != d.Worker {
		t.Fatalf("fallback after the leader's answer = %+v, %v; want its worker %s from the shadow", got, err, d.Worker)
	}
}

// Fed placements of this data plane's abandoned calls (the leader
// withdraws them) are not recorded, nor is anything while the block sizes
// differ; the rest is.
func TestApplyFeedSkipsAbandonedAndMismatched(t *testing.T) {
	r := newTestRouter(t, Options{ID: "dp1", ControlPlanes: []string{downURL(t)}, BlockChars: 16, Shadow: testShadow,
		BootWorkers: []router.WorkerStatus{{URL: wA, Healthy: true}, {URL: wB, Healthy: true}, {URL: wC, Healthy: true}}})
	pick := func(prompt string) string {
		t.Helper()
		d, err := r.fallback(context.Background(), &router.Request{Model: "m", Hashes: keyHashes(prompt + " next"), KeyLen: len(prompt) + 5, DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		return d.Candidate
	}
	placed := func(prompt, worker, dp string, routeID uint64) *cartv1.RecentPlacement {
		return &cartv1.RecentPlacement{Worker: worker, Hashes: index.Checkpoints(nil, keyHashes(prompt)), DataplaneId: dp, RouteId: routeID}
	}
	one, two, three := "the first prompt of this test, two blocks", "the second prompt of this test, two blocks", "the third prompt of this test, two blocks"
	r.shadow.record(keyHashes(one), wC) // the local fallback's choice for an abandoned call
	r.abandon(5)
	r.applyFeed([]*cartv1.RecentPlacement{placed(one, wA, "dp1", 5), placed(two, wB, "dp2", 5)})
	if got := pick(one); got != wC {
		t.Errorf("abandoned call: pick %q, want the fallback's own %s", got, wC)
	}
	if got := pick(two); got != wB {
		t.Errorf("another data plane's call with the same id: pick %q, want %s", got, wB)
	}
	r.cpBlockChars.Store(128)
	r.applyFeed([]*cartv1.RecentPlacement{placed(three, wA, "dp2", 6)})
	if got := pick(three); got != "" {
		t.Errorf("recorded a placement while the block sizes differ: pick %q", got)
	}
}
