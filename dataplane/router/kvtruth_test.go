package router

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
	"github.com/cartrouter/cart/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// kvTexts are three prompts of 4 blocks each, routed to worker a oldest
// first by routeKVTexts.
var kvTexts = []string{"0123456789abcdef", "ghijklmnopqrstuv", "wxyzABCDEFGHIJKL"}

func routeKVTexts(t *testing.T, l *Local) {
	t.Helper()
	for _, s := range kvTexts {
		d, err := l.Decide(context.Background(), request(s))
		if err != nil {
			t.Fatal(err)
		}
		l.Done(d, Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1})
	}
}

// heldBlocks is how many blocks of each of kvTexts worker a holds.
func heldBlocks(l *Local) []int {
	out := make([]int, len(kvTexts))
	l.dec.Do(decider.OpRead, func(eng *engine.Engine) {
		id, _ := eng.WorkerIDOf("a")
		for i, s := range kvTexts {
			var m index.Match
			eng.Index().Lookup(request(s).Hashes, &m)
			out[i] = m.BlocksFor(index.WorkerID(id))
		}
	})
	return out
}

// runLocal runs l until the test ends, and checks that Run then returns.
func runLocal(t *testing.T, l *Local) {
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); l.Run(ctx, time.Hour) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-ran:
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after its context ended")
		}
	})
}

// The all-in-one router seeds an unmodelled worker's model after its
// first KV report, on Run's seeding loop: a capacity below what the index
// holds forgets the oldest holdings, and an eviction reported in the same
// report is trimmed once the seed is complete.
func TestLocalKVReportSeedsTheModel(t *testing.T) {
	for _, evicted := range []bool{false, true} {
		l := newTestLocal("a")
		runLocal(t, l)
		routeKVTexts(t, l)
		// Capacity 8: the oldest prompt is forgotten by the seeded model.
		// Evicted down to 4: the next oldest goes too.
		l.ApplyKVReport("a", engine.KVReport{Synced: true, OccupiedBlocks: 4, CapacityBlocks: 8, Evicted: evicted})
		want := []int{0, 4, 4}
		if evicted {
			want[1] = 0
		}
		testkit.WaitFor(t, 10*time.Second, "the seed's holdings", func() bool {
			got := heldBlocks(l)
			return got[0] == want[0] && got[1] == want[1] && got[2] == want[2]
		})
	}
}

// A KV report never waits for the seed it starts (the stream that
// delivered it goes on reading), as on a control-plane leader: the
// report returns while the seed is held up in its last step, and Run's
// seeding loop stops with Run even then.
func TestLocalKVReportDoesNotWaitForTheSeed(t *testing.T) {
	l := newTestLocal("a")
	entered, release := make(chan struct{}, 1), make(chan struct{})
	l.seedTrimHook = func() {
		entered <- struct{}{}
		<-release
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan struct{})
	go func() { defer close(ran); l.Run(ctx, time.Hour) }()
	routeKVTexts(t, l)

	reported := make(chan struct{})
	go func() {
		defer close(reported)
		// Evicted: the seed defers a trim, so it reaches the hook.
		l.ApplyKVReport("a", engine.KVReport{Synced: true, OccupiedBlocks: 4, CapacityBlocks: 8, Evicted: true})
	}()
	<-entered // the seed is now held up in its trim
	select {
	case <-reported:
	case <-time.After(10 * time.Second):
		close(release) // lets the report (seeding on its own goroutine) end
		<-reported
		t.Fatal("the KV report waited for the seed it started")
	}
	var seeding bool
	l.dec.Do(decider.OpRead, func(eng *engine.Engine) { seeding = eng.Seeding() })
	if got := heldBlocks(l); got[1] != 4 {
		t.Fatalf("holdings %v (seeding %v): the held trim was applied", got, seeding)
	}
	// Another report meanwhile returns too (it joins the seed in progress).
	l.ApplyKVReport("a", engine.KVReport{Synced: true, OccupiedBlocks: 4, CapacityBlocks: 8})
	close(release)
	testkit.WaitFor(t, 10*time.Second, "the seed's trim", func() bool { return heldBlocks(l)[1] == 0 })
	cancel()
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	// A report after the router stopped wakes nothing and does not wait.
	l.ApplyKVReport("a", engine.KVReport{Synced: true, OccupiedBlocks: 4, CapacityBlocks: 8})
}
