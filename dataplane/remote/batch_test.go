package remote

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cartrouter/cart/controlplane/index"
	"github.com/cartrouter/cart/controlplane/service"
	"github.com/cartrouter/cart/dataplane/router"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
)

// holdFirstCall makes the next message r's stream sends, once armed, wait
// until n Route calls are in it or queued behind it, so that the test
// knows they are ready together (the held message may already carry
// more than one). Set before r runs.
func holdFirstCall(t *testing.T, r *Router, n int) *atomic.Bool {
	var armed atomic.Bool
	r.streams.flushHook = func(calls func() int) {
		if armed.CompareAndSwap(true, false) {
			if ok, _ := testkit.Poll(10*time.Second, func() (bool, string) { return calls() >= n, "" }); !ok {
				t.Errorf("%d calls in the held message or queued, want %d", calls(), n)
			}
		}
	}
	return &armed
}

// routeConcurrently routes n requests at once, each named so that the
// fake leader's answer shows whether it is this request's.
func routeConcurrently(t *testing.T, r *Router, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			id := fmt.Sprintf("req-%d", i)
			d, err := r.Decide(context.Background(), &router.Request{ID: id, DryRun: true})
			if err != nil || d.Worker != id || d.Reason == ReasonFallbackLocal {
				t.Errorf("%s: answered %+v (%v)", id, d, err)
			}
		})
	}
	wg.Wait()
}

// Calls ready together share a message to a leader that reads batches.
func TestStreamBatchesCallsToBatchingLeader(t *testing.T) {
	const n = 16
	cp, _ := newStreamCP(t)
	cp.batches = true
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, RouteStream: true, RouteTimeout: 10 * time.Second})
	armed := holdFirstCall(t, r, n)
	run(t, r)
	streamLive(t, r, cp.url)
	if !r.streams.live(cp.url).batches {
		t.Fatal("the leader's hello answer declared batches; the stream does not send them")
	}
	armed.Store(true)
	routeConcurrently(t, r, n)
	if b, m, c := cp.batched.Load(), cp.msgs.Load(), cp.calls.Load(); b == 0 || m >= c {
		t.Fatalf("%d calls in %d messages (%d batched): calls ready together were not batched", c, m, b)
	}
}

// A leader that predates batches (its hello answer does not declare them)
// gets one call a message, however many are ready together: it would
// drop the others unanswered.
func TestStreamOneCallPerMessageToOldLeader(t *testing.T) {
	const n = 16
	cp, _ := newStreamCP(t)
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, RouteStream: true, RouteTimeout: 10 * time.Second})
	armed := holdFirstCall(t, r, n)
	run(t, r)
	streamLive(t, r, cp.url)
	if r.streams.live(cp.url).batches {
		t.Fatal("batches on a stream whose leader did not declare them")
	}
	armed.Store(true)
	routeConcurrently(t, r, n)
	if b, m, c := cp.batched.Load(), cp.msgs.Load(), cp.calls.Load(); b != 0 || m != c {
		t.Fatalf("%d calls in %d messages, %d with more, to a leader that does not read them", c, m, b)
	}
}

// Answers batched in one message each reach their call, and feed frames
// batched with them (or with the hello's answer) reach the shadow.
func TestStreamReadsBatchedAnswers(t *testing.T) {
	const n = 16
	cp, _ := newStreamCP(t)
	cp.batches, cp.answerTogether, cp.feedAck = true, true, true
	prompt, early := "a prompt another data plane sent, fed in a batch", "a prompt fed with the answer to the hello"
	placed := func(prompt, worker string) *cartv1.StreamResponse {
		return &cartv1.StreamResponse{Result: &cartv1.StreamResponse_Placements{Placements: &cartv1.RecentPlacements{
			Placements: []*cartv1.RecentPlacement{{Worker: worker, Hashes: index.Checkpoints(nil, keyHashes(prompt)), DataplaneId: "dp-other"}}}}}
	}
	cp.extra = []*cartv1.StreamResponse{placed(prompt, wA)} // the fake's syncs name only wA
	cp.helloExtra = []*cartv1.StreamResponse{placed(early, wA)}
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, RouteStream: true, RouteTimeout: 10 * time.Second,
		PlacementFeed: true, Shadow: testShadow, BlockChars: shadowBlockChars})
	armed := holdFirstCall(t, r, n)
	run(t, r)
	streamLive(t, r, cp.url)
	armed.Store(true)
	routeConcurrently(t, r, n)
	if got := cp.answerMsgs.Load(); got == 0 {
		t.Fatal("the fake leader sent no batched answers: the test tests nothing")
	}
	for _, p := range []string{prompt, early} {
		testkit.WaitFor(t, 5*time.Second, "the batched feed frame in the shadow: "+p, func() bool {
			d, err := r.fallback(context.Background(), &router.Request{Model: "m", Hashes: keyHashes(p + " next"), KeyLen: len(p) + 5, DryRun: true})
			return err == nil && d.Candidate == wA
		})
	}
}

// Against a real leader: a batching data plane gets its concurrent calls
// answered over fewer messages than calls, and one that predates batches
// (noBatch) still gets every answer, one a message.
func TestStreamBatchingWithRealLeader(t *testing.T) {
	const n = 16
	for _, old := range []bool{false, true} {
		t.Run(fmt.Sprintf("old=%v", old), func(t *testing.T) {
			cp := newOneNodeCP(t, service.AuthOptions{})
			var c msgCounter
			r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, RouteStream: true, RouteTimeout: 10 * time.Second, Interceptors: c.interceptors()})
			r.streams.noBatch = old
			armed := holdFirstCall(t, r, n)
			run(t, r)
			streamLive(t, r, cp.url)
			if err := r.SyncOnce(context.Background()); err != nil {
				t.Fatal(err)
			}
			c.reset()
			armed.Store(true)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					req := &router.Request{Model: "m", Hashes: []uint64{uint64(i), uint64(i) + 100}, KeyLen: 128, DryRun: true}
					if d, err := r.Decide(context.Background(), req); err != nil || !d.FromLeader {
						t.Errorf("route %d: %+v %v", i, d, err)
					}
				})
			}
			wg.Wait()
			calls, msgs, answers, answerMsgs := c.counts()
			t.Logf("%d calls in %d messages, %d answers in %d messages", calls, msgs, answers, answerMsgs)
			if old {
				if msgs != calls || answerMsgs != answers {
					t.Fatalf("a data plane without batches: %d calls in %d messages, %d answers in %d", calls, msgs, answers, answerMsgs)
				}
			} else if msgs >= calls {
				t.Fatalf("%d calls in %d messages: not batched", calls, msgs)
			}
		})
	}
}

// failingSends makes the stream's sends fail once armed.
type failingSends struct{ armed atomic.Bool }

func (f *failingSends) interceptor() connect.Interceptor {
	return wrapStreamClient(func(sc connect.StreamingClientConn) connect.StreamingClientConn {
		return failingConn{StreamingClientConn: sc, f: f}
	})
}

type failingConn struct {
	connect.StreamingClientConn
	f *failingSends
}

func (c failingConn) Send(m any) error {
	if c.f.armed.Load() {
		return errors.New("injected send failure")
	}
	return c.StreamingClientConn.Send(m)
}

// A failed send breaks the stream: the call it carried and every call
// waiting for an answer fail at once (and fall back), not at their
// timeouts.
func TestStreamSendFailureBreaksStream(t *testing.T) {
	const pending = 5
	cp, _ := newStreamCP(t)
	cp.batches = true
	release := make(chan struct{})
	cp.hold = func(m *cartv1.StreamRequest) {
		if m.GetRoute() != nil {
			<-release
		}
	}
	var fail failingSends
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, RouteStream: true, RouteTimeout: time.Minute,
		Interceptors: []connect.Interceptor{fail.interceptor()}})
	run(t, r)
	t.Cleanup(func() { close(release) }) // before the fake leader's server closes
	streamLive(t, r, cp.url)
	results := make(chan router.Decision, pending+1)
	route := func(i int) {
		d, err := r.Decide(context.Background(), &router.Request{ID: fmt.Sprint(i), DryRun: true})
		if err != nil {
			t.Errorf("route %d: %v", i, err)
		}
		results <- d
	}
	for i := range pending {
		go route(i)
	}
	testkit.WaitFor(t, 5*time.Second, "routes waiting for answers", func() bool { return cp.inFly.Load() == pending })
	fail.armed.Store(true)
	go route(pending)
	for range pending + 1 {
		select {
		case d := <-results:
			if d.Reason != ReasonFallbackLocal {
				t.Fatalf("a call on the broken stream answered %+v, want a local fallback", d)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("calls on a stream whose send failed still wait")
		}
	}
}

// A Route whose caller gave up while it waited behind a send in progress
// never reaches the leader: the decision would place load for an answer
// nobody reads.
func TestStreamDropsRoutesGivenUpWhileQueued(t *testing.T) {
	cp, _ := newStreamCP(t)
	cp.batches = true
	r := newTestRouter(t, Options{ControlPlanes: []string{cp.url}, BootWorkers: boot, RouteStream: true, RouteTimeout: 10 * time.Second})
	entered, release := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	r.streams.flushHook = func(func() int) {
		if first.CompareAndSwap(false, true) {
			close(entered)
			<-release // the first call's send stays in progress
		}
	}
	run(t, r)
	streamLive(t, r, cp.url)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if d, err := r.Decide(context.Background(), &router.Request{ID: "kept", DryRun: true}); err != nil || d.Worker != "kept" {
			t.Errorf("the call in progress: %+v (%v)", d, err)
		}
	}()
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, _ = r.Decide(ctx, &router.Request{ID: "given-up", DryRun: true}) // returns once its deadline passed
	cancel()
	close(release)
	<-done
	if n := cp.calls.Load(); n != 1 {
		t.Fatalf("the leader got %d calls, want only the one whose caller waited", n)
	}
}
