package coalesce

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/cartrouter/cart/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is a flush that records its batches and, while gated, then
// waits for a release.
type recorder struct {
	mu      sync.Mutex
	batches [][]int
	gate    chan struct{} // nil: no wait
	entered chan struct{} // told when a flush recorded its batch and waits
	fail    func(n int) error
}

func (r *recorder) flush(b []int) error {
	r.mu.Lock()
	r.batches = append(r.batches, slices.Clone(b))
	n := len(r.batches)
	r.mu.Unlock()
	if r.gate != nil {
		r.entered <- struct{}{}
		<-r.gate
	}
	if r.fail != nil {
		return r.fail(n)
	}
	return nil
}

// steps lets n gated sends through, each once it started.
func (r *recorder) steps(n int) {
	for range n {
		<-r.entered
		r.gate <- struct{}{}
	}
}

func (r *recorder) got() [][]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.batches)
}

func gated() *recorder {
	return &recorder{gate: make(chan struct{}), entered: make(chan struct{}, 100)}
}

// queueWhile sends items from goroutines, one after the other, each once
// the previous one is queued, so their order is known.
func queueWhile(t *testing.T, s *Sender[int], items ...int) *sync.WaitGroup {
	t.Helper()
	var wg sync.WaitGroup
	for _, it := range items {
		want := s.Queued() + 1
		wg.Go(func() {
			if err := s.Send(it); err != nil {
				t.Errorf("send %d: %v", it, err)
			}
		})
		testkit.WaitFor(t, 5*time.Second, "item queued", func() bool { return s.Queued() == want })
	}
	return &wg
}

// Alone, an item is sent at once by its caller, as without coalescing.
func TestAloneSentAtOnce(t *testing.T) {
	r := &recorder{}
	s := New(r.flush, Options[int]{Max: 64})
	for i := range 3 {
		if err := s.Send(i); err != nil {
			t.Fatal(err)
		}
		if got := r.got(); len(got) != i+1 || !slices.Equal(got[i], []int{i}) {
			t.Fatalf("after Send(%d) returned: batches %v", i, got)
		}
	}
}

func checkBatches(t *testing.T, r *recorder, want [][]int) {
	t.Helper()
	if got := r.got(); !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("batches %v, want %v", got, want)
	}
}

// Items queued while a send is in progress go out together, in order, at
// most Max a send; the caller that sends hands the rest to a goroutine
// after Rounds sends instead of sending for others indefinitely.
func TestCoalescesAndHandsOff(t *testing.T) {
	r := gated()
	s := New(r.flush, Options[int]{Max: 4})
	owner := make(chan error, 1)
	go func() { owner <- s.Send(0) }()
	<-r.entered // the owner sends 0 alone
	wg := queueWhile(t, s, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	r.gate <- struct{}{}
	r.steps(1) // its second round: 1-4
	// The owner made its two rounds: it returns while 5-10 still wait
	// (the next send is held at the gate), and a goroutine of the Sender
	// sends them.
	select {
	case err := <-owner:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the sending caller did not return after its rounds")
	}
	r.steps(2)
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	checkBatches(t, r, [][]int{{0}, {1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10}})
}

// With Max 1 (a peer that does not read batches) every item is a send of
// its own, in order, even while items queue up.
func TestMaxOneSendsEachAlone(t *testing.T) {
	r := gated()
	s := New(r.flush, Options[int]{})
	go func() { _ = s.Send(0) }()
	<-r.entered
	wg := queueWhile(t, s, 1, 2, 3)
	r.gate <- struct{}{}
	r.steps(3)
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	checkBatches(t, r, [][]int{{0}, {1}, {2}, {3}})
}

// SetMax applies from the next send on.
func TestSetMax(t *testing.T) {
	r := gated()
	s := New(r.flush, Options[int]{})
	go func() { _ = s.Send(0) }()
	<-r.entered
	wg := queueWhile(t, s, 1, 2, 3)
	s.SetMax(64)
	r.gate <- struct{}{}
	r.steps(1)
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	checkBatches(t, r, [][]int{{0}, {1, 2, 3}})
}

// A send's summed cost stays within MaxCost, except an item alone.
func TestCostBound(t *testing.T) {
	r := gated()
	s := New(r.flush, Options[int]{Max: 64, Cost: func(v int) int { return v }, MaxCost: 10})
	go func() { _ = s.Send(1) }()
	<-r.entered
	wg := queueWhile(t, s, 4, 5, 2, 20, 3)
	r.gate <- struct{}{}
	r.steps(4)
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	checkBatches(t, r, [][]int{{1}, {4, 5}, {2}, {20}, {3}})
}

// SendCost takes the caller's cost for its item, which then batches by it
// as Send's would by Cost's, and Cost is not called for it.
func TestSendCostGivesTheCost(t *testing.T) {
	r := gated()
	var called atomic.Int32
	s := New(r.flush, Options[int]{Max: 64, MaxCost: 10, Cost: func(v int) int { called.Add(1); return v }})
	go func() { _ = s.SendCost(1, 1) }()
	<-r.entered
	// The values are not the costs: batches must follow the costs given.
	for _, c := range [][2]int{{40, 4}, {50, 5}, {20, 2}, {200, 20}, {30, 3}} {
		if err := s.SendCost(c[0], c[1]); err != nil {
			t.Fatal(err)
		}
	}
	r.gate <- struct{}{}
	r.steps(4)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	checkBatches(t, r, [][]int{{1}, {40, 50}, {20}, {200}, {30}})
	if n := called.Load(); n != 0 {
		t.Errorf("Cost called %d times for items sent with their cost", n)
	}
}

// Cost runs outside the Sender's lock, so a slow Cost (an encoded size)
// holds up no other Send. The probe is deterministic: the items are sent
// one after the other from this goroutine while the first send waits,
// unlocked, in flush, so no one but Cost's own caller can hold the lock
// while Cost runs.
func TestCostOutsideLock(t *testing.T) {
	r := gated()
	var (
		s            *Sender[int]
		costs, under atomic.Int32
	)
	s = New(r.flush, Options[int]{Max: 64, MaxCost: 10, Cost: func(v int) int {
		costs.Add(1)
		if s.mu.TryLock() {
			s.mu.Unlock()
		} else {
			under.Add(1)
		}
		return v
	}})
	go func() { _ = s.Send(1) }()
	<-r.entered
	for _, v := range []int{4, 5, 2, 20, 3} {
		if err := s.Send(v); err != nil { // queued behind the send in progress
			t.Fatal(err)
		}
	}
	r.gate <- struct{}{}
	r.steps(4)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if costs.Load() == 0 || under.Load() != 0 {
		t.Fatalf("Cost ran %d times, %d of them under the Sender's lock", costs.Load(), under.Load())
	}
	// The same batches as with Cost under the lock.
	checkBatches(t, r, [][]int{{1}, {4, 5}, {2}, {20}, {3}})
}

// Many concurrent callers: every item is sent exactly once, each caller's
// items in the order it sent them, no send over Max, and nothing is left
// queued once the callers returned and the Sender went idle.
func TestConcurrentNothingStranded(t *testing.T) {
	const callers, each, maxBatch = 32, 300, 8
	r := &recorder{}
	s := New(r.flush, Options[int]{Max: maxBatch, Queue: 16})
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			for i := range each {
				if err := s.Send(c*each + i); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	last := make([]int, callers)
	for i := range last {
		last[i] = -1
	}
	n, multi := 0, 0
	for _, b := range r.got() {
		if len(b) > maxBatch {
			t.Fatalf("a send of %d items, over Max %d", len(b), maxBatch)
		}
		if len(b) > 1 {
			multi++
		}
		for _, v := range b {
			c, i := v/each, v%each
			if i != last[c]+1 {
				t.Fatalf("caller %d: item %d after %d", c, i, last[c])
			}
			last[c] = i
			n++
		}
	}
	if n != callers*each {
		t.Fatalf("%d items sent, want %d", n, callers*each)
	}
	t.Logf("%d items in %d sends (%d of several)", n, len(r.got()), multi)
}

// failOn makes the nth send (counting from 1, as recorder.flush does) fail
// with err.
func failOn(nth int, err error) func(int) error {
	return func(n int) error {
		if n == nth {
			return err
		}
		return nil
	}
}

// The first failed send stops the Sender: its caller gets the error,
// Failed hears it once, what was queued is dropped, and no send follows.
func TestSendErrorStops(t *testing.T) {
	boom := errors.New("boom")
	r := gated()
	r.fail = failOn(2, boom)
	var failed []error
	var fmu sync.Mutex
	s := New(r.flush, Options[int]{Max: 2, Failed: func(err error) {
		fmu.Lock()
		failed = append(failed, err)
		fmu.Unlock()
	}})
	owner := make(chan error, 1)
	go func() { owner <- s.Send(0) }()
	<-r.entered
	wg := queueWhile(t, s, 1, 2, 3)
	r.gate <- struct{}{}
	r.steps(1) // {1, 2}: fails
	if err := <-owner; !errors.Is(err, boom) {
		t.Fatalf("owner's Send: %v, want its send's error", err)
	}
	wg.Wait()
	if err := s.Send(4); !errors.Is(err, boom) {
		t.Fatalf("Send after the failure: %v", err)
	}
	if err := s.Close(); !errors.Is(err, boom) {
		t.Fatalf("Close: %v", err)
	}
	checkBatches(t, r, [][]int{{0}, {1, 2}})
	fmu.Lock()
	defer fmu.Unlock()
	if len(failed) != 1 || !errors.Is(failed[0], boom) {
		t.Fatalf("Failed told %v, want boom once", failed)
	}
}

// A failure in the goroutine the owner handed off to reaches Failed too.
func TestHandedOffFailureReported(t *testing.T) {
	boom := errors.New("boom")
	r := gated()
	r.fail = failOn(3, boom)
	failed := make(chan error, 1)
	s := New(r.flush, Options[int]{Max: 1, Failed: func(err error) { failed <- err }})
	owner := make(chan error, 1)
	go func() { owner <- s.Send(0) }()
	<-r.entered
	wg := queueWhile(t, s, 1, 2, 3)
	r.gate <- struct{}{}
	r.steps(1)
	if err := <-owner; err != nil {
		t.Fatal(err)
	}
	r.steps(1) // 2, by the goroutine: fails
	if err := <-failed; !errors.Is(err, boom) {
		t.Fatalf("Failed told %v", err)
	}
	wg.Wait()
	if err := s.Close(); !errors.Is(err, boom) {
		t.Fatalf("Close: %v", err)
	}
	checkBatches(t, r, [][]int{{0}, {1}, {2}})
}

// A full queue makes Send wait for room rather than grow without bound.
func TestQueueBoundWaits(t *testing.T) {
	r := gated()
	s := New(r.flush, Options[int]{Max: 64, Queue: 2})
	go func() { _ = s.Send(0) }()
	<-r.entered
	wg := queueWhile(t, s, 1, 2)
	third := make(chan error, 1)
	go func() { third <- s.Send(3) }()
	testkit.WaitFor(t, 5*time.Second, "the third Send waiting for room", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.waiting == 1
	})
	if n := s.Queued(); n != 2 {
		t.Fatalf("%d queued, bound 2", n)
	}
	r.gate <- struct{}{}
	<-r.entered // {1, 2} taken: room for 3
	if err := <-third; err != nil {
		t.Fatal(err)
	}
	r.gate <- struct{}{}
	r.steps(1)
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	checkBatches(t, r, [][]int{{0}, {1, 2}, {3}})
}

// Close waits for the send in progress and what is queued, then refuses.
func TestCloseDrainsThenRefuses(t *testing.T) {
	r := gated()
	s := New(r.flush, Options[int]{Max: 64})
	go func() { _ = s.Send(0) }()
	<-r.entered
	wg := queueWhile(t, s, 1, 2)
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	testkit.WaitFor(t, 5*time.Second, "Close waiting", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.closed && s.waiting == 1
	})
	if err := s.Send(9); !errors.Is(err, ErrClosed) {
		t.Fatalf("Send during Close: %v", err)
	}
	r.gate <- struct{}{}
	r.steps(1)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	checkBatches(t, r, [][]int{{0}, {1, 2}})
}
