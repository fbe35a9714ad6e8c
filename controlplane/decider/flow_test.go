package decider

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/flow"
	"github.com/cartrouter/cart/internal/testkit"
)

// flowDecider is a decider over workers with the given max_concurrency,
// on the real clock (the queue's timeouts are timers).
func flowDecider(t *testing.T, fo FlowOptions, pol engine.Policy, conc ...int) *Decider {
	t.Helper()
	if pol.BlockChars == 0 {
		pol = engine.Policy{Threshold: 0.3, BalanceAbsThreshold: 64, BalanceRelThreshold: 1.5, BlockChars: 4,
			ReservePriority: pol.ReservePriority, ReserveSlots: pol.ReserveSlots}
	}
	d := New(Options{Policy: pol, MaxEntries: 10000, Flow: fo})
	var specs []engine.WorkerSpec
	for i, c := range conc {
		specs = append(specs, engine.WorkerSpec{URL: string(rune('a' + i)), MaxConcurrency: c})
	}
	d.SetWorkers(specs)
	return d
}

type admitResult struct {
	name string
	dec  Decision
	err  error
}

// admitAsync starts an Admit and returns where its result will arrive;
// it returns once the request is queued (or answered at once).
func admitAsync(t *testing.T, d *Decider, ctx context.Context, name, text string, a Admission) <-chan admitResult {
	t.Helper()
	out := make(chan admitResult, 1)
	queued := make(chan struct{})
	a.OnQueued = func() { close(queued) }
	go func() {
		dec, err := d.Admit(ctx, req(text), a)
		out <- admitResult{name, dec, err}
	}()
	select {
	case <-queued:
	case r := <-out:
		out <- r // answered without waiting
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: neither queued nor answered", name)
	}
	return out
}

func settleOK(t *testing.T, d *Decider, dec Decision) {
	t.Helper()
	if err := d.Settle(dec.Ticket, Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1}); err != nil {
		t.Fatal(err)
	}
}

func result(t *testing.T, ch <-chan admitResult) admitResult {
	t.Helper()
	return testkit.Recv(t, ch, 5*time.Second, "an answer")
}

func noResult(t *testing.T, ch <-chan admitResult) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s answered while it should wait: %v %v", r.name, r.dec.Worker, r.err)
	case <-time.After(20 * time.Millisecond):
	}
}

// Below every limit nothing waits: Admit is Route.
func TestAdmitUnsaturatedDecidesAtOnce(t *testing.T) {
	d := flowDecider(t, FlowOptions{}, engine.Policy{}, 2, 2)
	for i := range 4 {
		dec, err := d.Admit(context.Background(), req(fmt.Sprint("prompt ", i)), Admission{Tenant: "x"})
		if err != nil {
			t.Fatal(err)
		}
		if d.Load(dec.Worker) == 0 {
			t.Fatal("no load taken")
		}
	}
	if q := d.Queue(); len(q.Items) != 0 {
		t.Fatalf("%d queued below the limits", len(q.Items))
	}
	// The fifth finds both workers at 2 and waits.
	ch := admitAsync(t, d, context.Background(), "fifth", "prompt 5", Admission{Tenant: "x"})
	noResult(t, ch)
	if q := d.Queue(); len(q.Items) != 1 {
		t.Fatalf("%d queued, want the fifth", len(q.Items))
	}
}

// A release binds the next waiting request in the same lock hold, and a
// waiting request goes to the worker with room that holds its prefix.
func TestReleaseDispatchesLateBoundAndCacheAware(t *testing.T) {
	d := flowDecider(t, FlowOptions{}, engine.Policy{}, 1, 1, 1)
	long := "a long shared system prompt that identifies a conversation, turn "
	// c learns the prefix; a and b are busy with other prompts.
	held := map[string]Decision{}
	first := ""
	for _, text := range []string{long + "1", "other prompt one", "other prompt two"} {
		dec, err := d.Admit(context.Background(), req(text), Admission{Tenant: "x"})
		if err != nil {
			t.Fatal(err)
		}
		held[dec.Worker] = dec
		if first == "" {
			first = dec.Worker
		}
	}
	for w := range held {
		if d.Load(w) != 1 {
			t.Fatalf("setup: %s load %d", w, d.Load(w))
		}
	}
	prefixOn := first
	ch := admitAsync(t, d, context.Background(), "turn 2", long+"2", Admission{Tenant: "x"})
	noResult(t, ch)
	// Another worker frees first: the waiting request takes it (work
	// conserving), though its prefix is elsewhere.
	var other string
	for w := range held {
		if w != prefixOn {
			other = w
			break
		}
	}
	settleOK(t, d, held[other])
	r := result(t, ch)
	if r.err != nil || r.dec.Worker != other {
		t.Fatalf("dispatched to %q (%v), want the freed %s", r.dec.Worker, r.err, other)
	}
	// Now the prefix holder frees while two have room: the cache wins.
	ch = admitAsync(t, d, context.Background(), "turn 3", long+"3", Admission{Tenant: "x"})
	noResult(t, ch)
	settleOK(t, d, held[prefixOn])
	r = result(t, ch)
	if r.err != nil || r.dec.Worker != prefixOn || r.dec.Reason != engine.ReasonCacheHit {
		t.Fatalf("dispatched to %q (%s, %v), want the prefix holder %s as a cache hit", r.dec.Worker, r.dec.Reason, r.err, prefixOn)
	}
}

func TestDispatchOrderPriorityThenFairness(t *testing.T) {
	d := flowDecider(t, FlowOptions{}, engine.Policy{}, 1)
	first, err := d.Admit(context.Background(), req("busy"), Admission{Tenant: "x"})
	if err != nil {
		t.Fatal(err)
	}
	var chans []<-chan admitResult
	for i, a := range []Admission{
		{Tenant: "flood", Cost: 100}, {Tenant: "flood", Cost: 100}, {Tenant: "flood", Cost: 100},
		{Tenant: "calm", Cost: 100},
		{Tenant: "vip", Priority: 5, Cost: 100},
	} {
		chans = append(chans, admitAsync(t, d, context.Background(), fmt.Sprint(a.Tenant, i), fmt.Sprint("p", i), a))
	}
	if first.QueueDepth != 0 {
		t.Fatalf("a decision with nothing queued says %d wait", first.QueueDepth)
	}
	prev := first
	var order []string
	var depths []int
	for range chans {
		settleOK(t, d, prev)
		got := false
		deadline := time.After(5 * time.Second)
		for !got {
			for _, ch := range chans {
				select {
				case r := <-ch:
					if r.err != nil {
						t.Fatal(r.err)
					}
					order = append(order, r.name)
					depths = append(depths, r.dec.QueueDepth)
					prev, got = r.dec, true
				default:
				}
			}
			select {
			case <-deadline:
				t.Fatal("nothing dispatched after a release")
			default:
			}
		}
	}
	// vip (priority 5) first; then flood and calm alternate by tokens
	// served (calm lifted to flood's level, ties by name: calm < flood).
	want := []string{"vip4", "calm3", "flood0", "flood1", "flood2"}
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Fatalf("dispatch order %v, want %v", order, want)
	}
	// Each dispatched decision counts the queue it left, itself included:
	// the data plane's sign that completions are needed at once.
	if fmt.Sprint(depths) != "[5 4 3 2 1]" {
		t.Fatalf("queue depths on the dispatched decisions %v, want [5 4 3 2 1]", depths)
	}
}

func TestQueueTimeoutAndCancelLeaveNothing(t *testing.T) {
	d := flowDecider(t, FlowOptions{QueueTimeout: 50 * time.Millisecond}, engine.Policy{}, 1)
	busy, err := d.Admit(context.Background(), req("busy"), Admission{Tenant: "x"})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = d.Admit(context.Background(), req("waits"), Admission{Tenant: "x"})
	var re *RefusedError
	if !errors.As(err, &re) || re.Reason != RefusedTimeout || !errors.Is(err, ErrRefused) {
		t.Fatalf("after the queue timeout: %v", err)
	}
	if time.Since(start) < 50*time.Millisecond {
		t.Fatal("refused before the timeout")
	}
	// A deadline earlier than the timeout ends the wait earlier.
	_, err = d.Admit(context.Background(), req("deadline"), Admission{Tenant: "x", Deadline: time.Now().Add(time.Millisecond)})
	if !errors.As(err, &re) || re.Reason != RefusedTimeout {
		t.Fatalf("past its deadline: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch := admitAsync(t, d, ctx, "gone", "client leaves", Admission{Tenant: "x"})
	cancel()
	if r := result(t, ch); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("client gone while queued: %v", r.err)
	}
	if q := d.Queue(); len(q.Items) != 0 || d.Load("a") != 1 {
		t.Fatalf("after timeout and cancel: %d queued, load %d", len(q.Items), d.Load("a"))
	}
	settleOK(t, d, busy)
	if d.Load("a") != 0 {
		t.Fatalf("load %d after everything settled", d.Load("a"))
	}
}

func TestSheddableRefusedWhenSaturated(t *testing.T) {
	d := flowDecider(t, FlowOptions{}, engine.Policy{}, 1)
	if _, err := d.Admit(context.Background(), req("sheddable with room"), Admission{Tenant: "x", Priority: -1}); err != nil {
		t.Fatalf("sheddable request with room: %v", err)
	}
	_, err := d.Admit(context.Background(), req("sheddable, full"), Admission{Tenant: "x", Priority: -1})
	var re *RefusedError
	if !errors.As(err, &re) || re.Reason != RefusedShed {
		t.Fatalf("sheddable request on a saturated pool: %v", err)
	}
	if q := d.Queue(); len(q.Items) != 0 {
		t.Fatal("a sheddable request was queued")
	}
}

func TestQueueBoundsRefuse(t *testing.T) {
	d := flowDecider(t, FlowOptions{Limits: flow.Limits{MaxItems: 2, MaxItemsPerTenant: 1}}, engine.Policy{}, 1)
	if _, err := d.Admit(context.Background(), req("busy"), Admission{Tenant: "x"}); err != nil {
		t.Fatal(err)
	}
	admitAsync(t, d, context.Background(), "x1", "x1", Admission{Tenant: "x"})
	_, err := d.Admit(context.Background(), req("x2"), Admission{Tenant: "x"})
	var re *RefusedError
	if !errors.As(err, &re) || re.Reason != RefusedTenantFull {
		t.Fatalf("tenant over its bound: %v", err)
	}
	admitAsync(t, d, context.Background(), "y1", "y1", Admission{Tenant: "y"})
	_, err = d.Admit(context.Background(), req("z1"), Admission{Tenant: "z"})
	if !errors.As(err, &re) || re.Reason != RefusedQueueFull {
		t.Fatalf("queue over its bound: %v", err)
	}
}

// With flow control off a saturated pool is a 503 at once, as before.
func TestFlowOffRefusesAtOnce(t *testing.T) {
	d := flowDecider(t, FlowOptions{Off: true}, engine.Policy{}, 1)
	if _, err := d.Admit(context.Background(), req("busy"), Admission{}); err != nil {
		t.Fatal(err)
	}
	_, err := d.Admit(context.Background(), req("second"), Admission{})
	if !errors.Is(err, ErrNoCapacity) || !errors.Is(err, engine.ErrAllSaturated) {
		t.Fatalf("flow off, saturated: %v", err)
	}
}

// The headroom keeps slots free for high-priority traffic while it is
// active: a flood below the priority saturates at limit-1, and the
// high-priority request still finds room at once.
func TestHeadroomForHighPriority(t *testing.T) {
	d := flowDecider(t, FlowOptions{ReserveWindow: time.Hour}, engine.Policy{ReservePriority: 10, ReserveSlots: 1}, 3)
	// Before any high-priority request the flood may use all three.
	for i := range 3 {
		if _, err := d.Admit(context.Background(), req(fmt.Sprint("flood ", i)), Admission{Tenant: "flood"}); err != nil {
			t.Fatal(err)
		}
	}
	d2 := flowDecider(t, FlowOptions{ReserveWindow: time.Hour}, engine.Policy{ReservePriority: 10, ReserveSlots: 1}, 3)
	vip, err := d2.Admit(context.Background(), req("vip"), Admission{Tenant: "vip", Priority: 10})
	if err != nil {
		t.Fatal(err)
	}
	settleOK(t, d2, vip)
	// Now the reserve is on: the flood gets two slots, the third waits.
	for i := range 2 {
		if _, err := d2.Admit(context.Background(), req(fmt.Sprint("flood ", i)), Admission{Tenant: "flood"}); err != nil {
			t.Fatal(err)
		}
	}
	ch := admitAsync(t, d2, context.Background(), "flood 2", "flood 2", Admission{Tenant: "flood"})
	noResult(t, ch)
	if _, err := d2.Admit(context.Background(), req("vip again"), Admission{Tenant: "vip", Priority: 10}); err != nil {
		t.Fatalf("high priority request with the reserve: %v", err)
	}
}

// ObserveEngine learns a limit from the engine's queue: unknown (no limit)
// until the engine first queues.
func TestLearnedConcurrencySaturates(t *testing.T) {
	d := flowDecider(t, FlowOptions{}, engine.Policy{}, 0)
	for i := range 5 {
		if _, err := d.Admit(context.Background(), req(fmt.Sprint("p", i)), Admission{}); err != nil {
			t.Fatalf("no limit known: %v", err)
		}
	}
	d.ObserveEngine("a", engine.EngineLoad{Running: 4, Waiting: 1})
	ch := admitAsync(t, d, context.Background(), "sixth", "p6", Admission{})
	noResult(t, ch)
	if lim, learned := d.Concurrency("a"); lim != 4 || !learned {
		t.Fatalf("learned %d (%v), want 4", lim, learned)
	}
}

// A leader's queued calls are this term's: losing leadership answers
// them, and the data planes ask the next leader.
func TestLeadershipLossAnswersQueuedCalls(t *testing.T) {
	d := flowDecider(t, FlowOptions{}, engine.Policy{}, 1)
	d.Lead(true)
	c := Caller{DataPlane: "dp1", RouteID: 1}
	if _, err := d.AdmitFor(context.Background(), c, req("busy"), Admission{}); err != nil {
		t.Fatal(err)
	}
	out := make(chan error, 1)
	go func() {
		_, err := d.AdmitFor(context.Background(), Caller{DataPlane: "dp1", RouteID: 2}, req("waits"), Admission{})
		out <- err
	}()
	waitFor(t, func() bool { return len(d.Queue().Items) == 1 })
	d.Lead(false)
	select {
	case err := <-out:
		if !errors.Is(err, ErrNotLeading) {
			t.Fatalf("queued call after losing leadership: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("queued call not answered after losing leadership")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5 s")
		}
		time.Sleep(time.Millisecond)
	}
}

// Many clients admitting, leaving and settling concurrently: every Admit
// ends exactly once, no worker ever holds more than its limit, and when
// all is settled no load is left and nothing waits.
func TestFlowUnderConcurrency(t *testing.T) {
	d := flowDecider(t, FlowOptions{QueueTimeout: 200 * time.Millisecond, Limits: flow.Limits{MaxItems: 50}}, engine.Policy{ReservePriority: 3, ReserveSlots: 1}, 2, 3, 1)
	var wg sync.WaitGroup
	var over atomic.Int64
	limits := map[string]int{"a": 2, "b": 3, "c": 1}
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for i := range 60 {
				ctx, cancel := context.WithCancel(context.Background())
				if rng.IntN(5) == 0 {
					time.AfterFunc(time.Duration(rng.IntN(3000))*time.Microsecond, cancel)
				}
				dec, err := d.Admit(ctx, req(fmt.Sprint("g", g, " r", i%7)), Admission{
					Tenant: fmt.Sprint("t", g%3), Priority: rng.IntN(5) - 1, Cost: int64(rng.IntN(200)), Bytes: 100,
				})
				cancel()
				if err != nil {
					var re *RefusedError
					if !errors.As(err, &re) && !errors.Is(err, context.Canceled) {
						t.Errorf("unexpected error %v", err)
					}
					continue
				}
				if d.Load(dec.Worker) > limits[dec.Worker] {
					over.Add(1)
				}
				time.Sleep(time.Duration(rng.IntN(500)) * time.Microsecond)
				_ = d.Settle(dec.Ticket, Outcome{Delivered: rng.IntN(2) == 0, PromptTokens: 10, CompletionTokens: 5, CachedTokens: -1})
			}
		}()
	}
	wg.Wait()
	if over.Load() > 0 {
		t.Fatalf("%d decisions found their worker above its limit", over.Load())
	}
	for w := range limits {
		if l := d.Load(w); l != 0 {
			t.Fatalf("worker %s keeps load %d", w, l)
		}
	}
	if q := d.Queue(); len(q.Items) != 0 || q.Bytes != 0 {
		t.Fatalf("%d requests left queued (%d bytes)", len(q.Items), q.Bytes)
	}
	if _, under := d.IndexStats(); under != 0 {
		t.Fatalf("%d load underflows", under)
	}
}

// A tenant is charged its estimated prompt at dispatch and corrected by
// its usage report to prompt + completion tokens: what it was served.
func TestFairnessChargesTokensServed(t *testing.T) {
	d := flowDecider(t, FlowOptions{}, engine.Policy{}, 1)
	busy, err := d.Admit(context.Background(), req("busy"), Admission{Tenant: "other"})
	if err != nil {
		t.Fatal(err)
	}
	ch := admitAsync(t, d, context.Background(), "x", "queued prompt", Admission{Tenant: "x", Cost: 40})
	// A second tenant keeps x's counter alive in the queue's table.
	admitAsync(t, d, context.Background(), "y", "other queued", Admission{Tenant: "y", Cost: 1000})
	settleOK(t, d, busy)
	r := result(t, ch)
	if r.err != nil {
		t.Fatal(r.err)
	}
	served := func(tenant string) float64 {
		t.Helper()
		tk := d.lock()
		defer d.unlock(OpRead, tk)
		return d.fq.Served(tenant)
	}
	if got := served("x"); got != 40 {
		t.Fatalf("charged %v at dispatch, want the estimate 40", got)
	}
	if err := d.Settle(r.dec.Ticket, Outcome{Delivered: true, PromptTokens: 100, CachedTokens: -1, CompletionTokens: 30}); err != nil {
		t.Fatal(err)
	}
	if got := served("x"); got != 130 {
		t.Fatalf("after the usage report: %v, want 100 prompt + 30 completion", got)
	}
}

// Completions riding with a new call free room for the requests already
// waiting, not for the call that carried them.
func TestRidingCompletionsServeTheQueueFirst(t *testing.T) {
	d := flowDecider(t, FlowOptions{}, engine.Policy{}, 1)
	d.Lead(true)
	first, err := d.AdmitFor(context.Background(), Caller{DataPlane: "dp1", RouteID: 1}, req("busy"), Admission{Tenant: "t"})
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() {
		_, err := d.AdmitFor(context.Background(), Caller{DataPlane: "dp2", RouteID: 1}, req("waits"), Admission{Tenant: "calm"})
		waiting <- err
	}()
	waitFor(t, func() bool { return len(d.Queue().Items) == 1 })
	// dp1's next call carries the first one's completion.
	newer := make(chan error, 1)
	go func() {
		_, err := d.AdmitFor(context.Background(), Caller{DataPlane: "dp1", RouteID: 2, Settle: []Completion{{Ticket: first.Ticket.ID, Worker: "a",
			Outcome: Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1}}}}, req("newer"), Admission{Tenant: "flood"})
		newer <- err
	}()
	select {
	case err := <-waiting:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting request did not get the room the riding completion freed")
	}
	select {
	case err := <-newer:
		t.Fatalf("the call that carried the completion took the room itself (%v)", err)
	case <-time.After(50 * time.Millisecond):
	}
	if n := len(d.Queue().Items); n != 1 {
		t.Fatalf("%d queued, want the newer call", n)
	}
}

// chatUsage is the usage report of one of the fairness tests' chats.
var chatUsage = Outcome{Delivered: true, PromptTokens: 545, CachedTokens: 512, CompletionTokens: 28}

// tenantAdmitter admits (admitAsync) one chat of a tenant, named.
func tenantAdmitter(t *testing.T, d *Decider) func(name, tenant string) <-chan admitResult {
	return func(name, tenant string) <-chan admitResult {
		return admitAsync(t, d, context.Background(), name, "prompt of "+name, Admission{Tenant: tenant, Cost: 540})
	}
}

// A tenant that comes back from idle is lifted to start level with the
// tenant flooding the pool. The usage report of its previous request,
// arriving while it waits, was service before the lift and fills the
// lift instead of putting it behind (without that this test fails), so
// the next free slot is the returning tenant's, whatever the tenants are
// called ("web" sorts after "batch"). The tie-break by the last lift is
// flow's TestIdleTenantIsLiftedNotCredited.
func TestReturningTenantTakesTheNextSlot(t *testing.T) {
	d := flowDecider(t, FlowOptions{}, engine.Policy{}, 2)
	admit := tenantAdmitter(t, d)
	c1 := result(t, admit("c1", "web"))   // room: at once
	f1 := result(t, admit("f1", "batch")) // the last slot
	f2 := admit("f2", "batch")
	noResult(t, f2)
	if err := d.Settle(f1.dec.Ticket, chatUsage); err != nil {
		t.Fatal(err)
	}
	if r := result(t, f2); r.err != nil {
		t.Fatal(r.err)
	}
	f3 := admit("f3", "batch")
	c2 := admit("c2", "web") // lifted to batch's counter
	noResult(t, c2)
	// web's previous request ends (with its report) and frees the slot.
	if err := d.Settle(c1.dec.Ticket, chatUsage); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-c2:
		if r.err != nil {
			t.Fatal(r.err)
		}
	case r := <-f3:
		t.Fatalf("the flood's %s took the slot (served: web %v, batch %v)", r.name, d.Queue().Served["web"], d.Queue().Served["batch"])
	case <-time.After(5 * time.Second):
		t.Fatal("nothing dispatched")
	}
	noResult(t, f3)
}

// A probe's slot (a learned limit just raised, not yet confirmed by the
// engine) goes to the waiting request the policy would serve last, the
// most-served tenant's, not to the tenant owed the next slot: a failed
// probe makes its request wait in the engine behind a running sequence.
func TestProbeSlotGoesToTheLastInOrder(t *testing.T) {
	d := flowDecider(t, FlowOptions{}, engine.Policy{}, 0)
	admit := tenantAdmitter(t, d)
	b1 := result(t, admit("b1", "batch")) // no limit known: at once
	b2 := result(t, admit("b2", "batch"))
	d.ObserveEngine("a", engine.EngineLoad{Running: 2, Waiting: 1}) // learned 2: saturated
	b3 := admit("b3", "batch")
	noResult(t, b3)
	if err := d.Settle(b1.dec.Ticket, chatUsage); err != nil {
		t.Fatal(err)
	}
	if r := result(t, b3); r.err != nil {
		t.Fatal(r.err)
	}
	b4 := admit("b4", "batch")
	w1 := admit("w1", "web") // lifted to the virtual time: below batch, first in order
	noResult(t, w1)
	if q := d.Queue(); q.Served["web"] >= q.Served["batch"] {
		t.Fatalf("served: web %v, batch %v; the test needs web first in order", q.Served["web"], q.Served["batch"])
	}
	for range engine.GrowAfter {
		d.ObserveEngine("a", engine.EngineLoad{Running: 2, Waiting: 0})
	}
	if lim, _ := d.Concurrency("a"); lim != 3 {
		t.Fatalf("limit %d after GrowAfter reads at 2, want 3 (a probe)", lim)
	}
	select {
	case r := <-b4:
		if r.err != nil {
			t.Fatal(r.err)
		}
	case r := <-w1:
		t.Fatalf("the probe's slot went to %s, the tenant owed the next real slot", r.name)
	case <-time.After(5 * time.Second):
		t.Fatal("the raised limit dispatched nothing")
	}
	noResult(t, w1)
	// The engine runs 3 with nothing waiting (the probe held); the next
	// real slot, freed by b2, is web's.
	d.ObserveEngine("a", engine.EngineLoad{Running: 3, Waiting: 0})
	if err := d.Settle(b2.dec.Ticket, chatUsage); err != nil {
		t.Fatal(err)
	}
	if r := result(t, w1); r.err != nil {
		t.Fatal(r.err)
	}
}
