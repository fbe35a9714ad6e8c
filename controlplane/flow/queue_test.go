package flow

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

type req struct{ name string }

func item(tenant string, prio int, deadline, cost int64, name string) *Item[req] {
	return &Item[req]{Tenant: tenant, Priority: prio, Deadline: deadline, Cost: cost, Bytes: 10, Value: req{name}}
}

// takeAll dispatches everything, one item per Dispatch call as when one
// slot frees at a time, and returns the names in dispatch order.
func takeAll(q *Queue[req]) []string {
	var out []string
	for q.Len() > 0 {
		n, _ := q.Dispatch(0, func(it *Item[req]) Verdict {
			out = append(out, it.Value.name)
			return Taken
		})
		if n == 0 {
			break
		}
	}
	return out
}

// takeOne dispatches the single item the policy picks next.
func takeOne(t *testing.T, q *Queue[req]) string {
	t.Helper()
	var got string
	first := true
	q.Dispatch(0, func(it *Item[req]) Verdict {
		if !first {
			return Stop
		}
		first = false
		got = it.Value.name
		return Taken
	})
	return got
}

func mustPush(t *testing.T, q *Queue[req], its ...*Item[req]) {
	t.Helper()
	for _, it := range its {
		if err := q.Push(it); err != nil {
			t.Fatal(err)
		}
	}
}

func TestHigherPriorityFirst(t *testing.T) {
	q := New[req](Limits{})
	mustPush(t, q,
		item("a", 0, 1, 1, "a0"),
		item("b", 5, 2, 1, "b5"),
		item("c", -1, 0, 1, "c-1"),
		item("a", 5, 3, 1, "a5"),
	)
	got := []string{takeOne(t, q), takeOne(t, q), takeOne(t, q), takeOne(t, q)}
	// Band 5 first (its two tenants tie at 0 served: by name), then 0, then -1.
	if want := []string{"a5", "b5", "a0", "c-1"}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

func TestEarliestDeadlineFirstWithinTenant(t *testing.T) {
	q := New[req](Limits{})
	mustPush(t, q,
		item("a", 0, 300, 1, "late"),
		item("a", 0, 100, 1, "early"),
		item("a", 0, 200, 1, "mid1"),
		item("a", 0, 200, 1, "mid2"), // same deadline: arrival order
	)
	if got, want := takeAll(q), []string{"early", "mid1", "mid2", "late"}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

// Fairness counts tokens, not requests: a tenant of long prompts gets as
// many tokens as one of short prompts, so fewer requests.
func TestTokenFairnessBetweenTenants(t *testing.T) {
	q := New[req](Limits{})
	for i := range 100 {
		mustPush(t, q, item("long", 0, int64(i), 1000, "L"), item("short", 0, int64(i), 100, "S"))
	}
	served := map[string]int64{}
	for range 55 {
		switch takeOne(t, q) {
		case "L":
			served["long"] += 1000
		case "S":
			served["short"] += 100
		}
	}
	// 55 dispatches: 5 long (5,000 tokens) and 50 short (5,000 tokens).
	if d := served["long"] - served["short"]; d < -1000 || d > 1000 {
		t.Fatalf("tokens served long %d short %d: not within one request of each other", served["long"], served["short"])
	}
}

// A tenant that was idle is lifted to where the busy tenant's last
// request started, less ReturnCredit requests of the size of the one it
// brings: a burst of ReturnCredit+2 goes next, but it cannot spend its
// idle time as credit for a longer one; from there the two alternate.
func TestIdleTenantIsLiftedNotCredited(t *testing.T) {
	for _, tc := range []struct {
		credit int
		lifted float64
		want   []string
	}{
		// Its first request goes at once, its second on the tie (it was
		// lifted last; by name, batch would win it): the burst of ten does
		// not take ten slots in a row.
		{0, 1900, []string{"C", "C", "F", "C", "F", "C", "F", "C"}},
		{2, 1700, []string{"C", "C", "C", "C", "F", "C", "F", "C"}},
	} {
		q := New[req](Limits{ReturnCredit: tc.credit})
		flood(t, q, "batch", 50, 20)
		if q.Served("batch") != 2000 {
			t.Fatalf("batch served %v, want 2000", q.Served("batch"))
		}
		for i := range 10 {
			mustPush(t, q, item("web", 0, int64(100+i), 100, "C"))
		}
		if q.Served("web") != tc.lifted {
			t.Fatalf("credit %d: web lifted to %v, want %v (where batch's last request started, less the credit)", tc.credit, q.Served("web"), tc.lifted)
		}
		var got []string
		for range 8 {
			got = append(got, takeOne(t, q))
		}
		if !slices.Equal(got, tc.want) {
			t.Fatalf("credit %d: dispatches %v, want %v", tc.credit, got, tc.want)
		}
	}
}

// The credit is a bound on how far behind a tenant starts, not a gift on
// each return: a tenant that sends a burst each time its last one has left
// the queue is served its share over time, no more, however often it
// returns.
func TestReturnCreditKeepsTheShare(t *testing.T) {
	const credit = 3
	q := New[req](Limits{ReturnCredit: credit})
	flood(t, q, "batch", 20, 0)
	got := map[string]int{}
	returns := 0
	for n := range 600 {
		if !hasQueued(q, "web") {
			returns++
			for i := range 5 {
				mustPush(t, q, item("web", 0, int64(n*10+i), 100, "C"))
			}
		}
		for q.Len()-queuedOf(q, "web") < 10 {
			mustPush(t, q, item("batch", 0, int64(n*10), 100, "F"))
		}
		got[takeOne(t, q)]++
	}
	// Equal requests: each return may put web up to credit+2 requests
	// ahead; a gift on every return would add up over the returns.
	if d := got["C"] - got["F"]; returns < 50 || d > credit+2 || d < -(credit+2) {
		t.Fatalf("dispatched web %d batch %d over %d returns: more than the credit apart", got["C"], got["F"], returns)
	}
}

func queuedOf(q *Queue[req], tenant string) int {
	n := 0
	q.Each(func(it *Item[req]) {
		if it.Tenant == tenant {
			n++
		}
	})
	return n
}

func hasQueued(q *Queue[req], tenant string) bool { return queuedOf(q, tenant) > 0 }

// Credit is not banked while the queue is empty either: a tenant that
// comes back when nothing waits starts where the last request started, not
// from the counter it left with, or it would take every slot until it had
// caught up with what the others were served meanwhile.
func TestNoCreditBankedWhileTheQueueWasEmpty(t *testing.T) {
	q := New[req](Limits{})
	mustPush(t, q, item("calm", 0, 0, 100, "C"))
	takeOne(t, q)
	for i := range 30 {
		mustPush(t, q, item("flood", 0, int64(i), 100, "F"))
	}
	takeAll(q)
	if q.Len() != 0 || q.Served("flood") != 3000 {
		t.Fatalf("%d queued, flood served %v; want none and 3000", q.Len(), q.Served("flood"))
	}
	for i := range 5 {
		mustPush(t, q, item("calm", 0, int64(100+i), 100, "C"))
	}
	if q.Served("calm") != 2900 {
		t.Fatalf("calm at %v on return to an empty queue, want lifted to 2900", q.Served("calm"))
	}
	for i := range 5 {
		mustPush(t, q, item("flood", 0, int64(100+i), 100, "F"))
	}
	var got []string
	for range 6 {
		got = append(got, takeOne(t, q))
	}
	if want := []string{"C", "C", "F", "C", "F", "C"}; !slices.Equal(got, want) {
		t.Fatalf("dispatches %v, want %v", got, want)
	}
}

// A tenant still waiting at one priority was not idle: a request it sends
// at another priority does not lift its counter (which both bands use).
func TestNoLiftWhileWaitingAtAnotherPriority(t *testing.T) {
	q := New[req](Limits{})
	flood(t, q, "flood", 10, 5)
	mustPush(t, q, item("mixed", 0, 100, 100, "M0")) // lifted to 400
	q.ChargeSince("flood", 10000, q.Epoch("flood"))
	q.Started("flood") // the virtual time is now 10,500
	mustPush(t, q, item("mixed", 5, 100, 100, "M5"))
	if q.Served("mixed") != 400 {
		t.Fatalf("mixed at %v after a push at another priority, want 400 (not lifted while it waits)", q.Served("mixed"))
	}
}

// Requests that started without waiting move the virtual time too
// (Started): a tenant that was served through an unsaturated pool's free
// slots is level with one returning when the pool fills, not behind it.
func TestRequestsStartedWithoutWaitingMoveTheVirtualTime(t *testing.T) {
	q := New[req](Limits{})
	mustPush(t, q, item("batch", 0, 0, 100, "B"), item("web", 0, 0, 100, "W"))
	takeAll(q)
	// The pool has room: batch's requests start at once and report 5,000
	// tokens; web is idle.
	for range 5 {
		q.Started("batch")
		q.ChargeSince("batch", 1000, q.Epoch("batch"))
	}
	q.Started("batch")
	q.Started("nobody") // no counter: ignored
	mustPush(t, q, item("web", 0, 1, 100, "W"))
	if q.Served("web") != 5100 {
		t.Fatalf("web at %v on return, want 5100 (where batch's last request started)", q.Served("web"))
	}
}

// flood queues n requests of 100 tokens (named "F") for tenant at
// priority 0 and dispatches the first taken of them.
func flood(t *testing.T, q *Queue[req], tenant string, n, taken int) {
	t.Helper()
	for i := range n {
		mustPush(t, q, item(tenant, 0, int64(i), 100, "F"))
	}
	for range taken {
		takeOne(t, q)
	}
}

func countOf(s []string, v string) int {
	n := 0
	for _, x := range s {
		if x == v {
			n++
		}
	}
	return n
}

func TestWeightsScaleShares(t *testing.T) {
	q := New[req](Limits{})
	for i := range 100 {
		a := item("gold", 0, int64(i), 100, "G")
		a.Weight = 3
		mustPush(t, q, a, item("std", 0, int64(i), 100, "S"))
	}
	var got []string
	for range 40 {
		got = append(got, takeOne(t, q))
	}
	if g := countOf(got, "G"); g < 29 || g > 31 {
		t.Fatalf("gold (weight 3) took %d of 40, want ~30", g)
	}
}

// An item no worker with room can take is skipped; the ones behind it, of
// its tenant and others, still go (work-conserving).
func TestSkippedItemsDoNotBlock(t *testing.T) {
	q := New[req](Limits{})
	mustPush(t, q, item("a", 9, 1, 1, "other-model"), item("a", 9, 2, 1, "a2"), item("b", 0, 1, 1, "b1"))
	var taken []string
	q.Dispatch(0, func(it *Item[req]) Verdict {
		if it.Value.name == "other-model" {
			return Skip
		}
		taken = append(taken, it.Value.name)
		return Taken
	})
	if !slices.Equal(taken, []string{"a2", "b1"}) || q.Len() != 1 {
		t.Fatalf("taken %v, %d left; want a2, b1 and the skipped one left", taken, q.Len())
	}
}

// A returning tenant is lifted to the least backlogged counter; reports of
// its requests dispatched before the lift fill the lift first, and only
// what exceeds it counts; a report of one dispatched after counts whole.
func TestReportsFromBeforeALiftFillIt(t *testing.T) {
	q := New[req](Limits{})
	mustPush(t, q, item("flood", 0, 1, 0, "f1"))
	q.ChargeSince("flood", 1000, q.Epoch("flood"))
	q.Started("flood")
	before := q.Epoch("calm")
	mustPush(t, q, item("calm", 0, 1, 0, "c1")) // lifted from 0 to 1000
	if q.Served("calm") != 1000 || q.Epoch("calm") == before {
		t.Fatalf("calm at %v (epoch %d, was %d), want lifted to 1000", q.Served("calm"), q.Epoch("calm"), before)
	}
	steps := []struct {
		tokens int64
		epoch  uint64
		want   float64
	}{
		{-200, before, 1000},        // less served before the lift: the lift holds (and has 1200 to fill)
		{700, before, 1000},         // filled by the lift (500 left)
		{800, before, 1300},         // 500 fill the rest, 300 count
		{50, q.Epoch("calm"), 1350}, // dispatched after the lift: counts whole
		{-2000, q.Epoch("calm"), 0}, // never below 0
	}
	for i, s := range steps {
		q.ChargeSince("calm", s.tokens, s.epoch)
		if got := q.Served("calm"); got != s.want {
			t.Fatalf("step %d: calm at %v, want %v", i, got, s.want)
		}
	}
}

func TestStopEndsThePass(t *testing.T) {
	q := New[req](Limits{})
	mustPush(t, q, item("a", 0, 1, 1, "a1"), item("a", 0, 2, 1, "a2"))
	offers := 0
	q.Dispatch(0, func(*Item[req]) Verdict { offers++; return Stop })
	if offers != 1 || q.Len() != 2 {
		t.Fatalf("%d offers after Stop, %d left", offers, q.Len())
	}
}

func TestDroppedLeavesUncharged(t *testing.T) {
	q := New[req](Limits{})
	mustPush(t, q, item("a", 0, 1, 500, "gone"), item("a", 0, 2, 1, "a2"))
	taken, dropped := q.Dispatch(0, func(it *Item[req]) Verdict {
		if it.Value.name == "gone" {
			return Dropped
		}
		return Taken
	})
	if taken != 1 || dropped != 1 || q.Served("a") != 1 {
		t.Fatalf("taken %d dropped %d served %v", taken, dropped, q.Served("a"))
	}
}

func TestBounds(t *testing.T) {
	cases := []struct {
		name  string
		lim   Limits
		pushA int // items of tenant a pushed before the one that fails
		scope string
		what  string
	}{
		{"queue requests", Limits{MaxItems: 3}, 3, "queue", "requests"},
		{"queue bytes", Limits{MaxBytes: 35}, 3, "queue", "bytes"},
		{"tenant requests", Limits{MaxItemsPerTenant: 2}, 2, "tenant", "requests"},
		{"tenant bytes", Limits{MaxBytesPerTenant: 25}, 2, "tenant", "bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q := New[req](c.lim)
			for i := range c.pushA {
				mustPush(t, q, item("a", 0, int64(i), 1, "a"))
			}
			err := q.Push(item("a", 0, 99, 1, "over"))
			var full *ErrFull
			if !errors.As(err, &full) || full.Scope != c.scope || full.What != c.what {
				t.Fatalf("push over the bound: %v, want %s %s full", err, c.scope, c.what)
			}
			if q.Len() != c.pushA || q.Bytes() != int64(10*c.pushA) {
				t.Fatalf("a refused push changed the queue: %d items %d bytes", q.Len(), q.Bytes())
			}
		})
	}
	// Per-tenant bounds leave other tenants their room.
	q := New[req](Limits{MaxItemsPerTenant: 1})
	mustPush(t, q, item("a", 0, 1, 1, "a"), item("b", 0, 1, 1, "b"))
}

func TestRemoveAndDuplicate(t *testing.T) {
	q := New[req](Limits{})
	a, b := item("a", 0, 1, 1, "a"), item("a", 0, 2, 1, "b")
	mustPush(t, q, a, b)
	if !errors.Is(q.Push(a), ErrDuplicate) {
		t.Fatal("pushed an item twice")
	}
	if !q.Remove(a) || q.Remove(a) || a.Queued() {
		t.Fatal("Remove of a queued item, then again")
	}
	if got := takeAll(q); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("left %v", got)
	}
	if q.Len() != 0 || q.Bytes() != 0 || len(q.bands) != 0 {
		t.Fatalf("empty queue keeps %d items %d bytes %d bands", q.Len(), q.Bytes(), len(q.bands))
	}
}

func TestIdleCountersArePruned(t *testing.T) {
	q := New[req](Limits{MaxTenants: 3})
	for i := range 10 {
		mustPush(t, q, item(fmt.Sprint("t", i), 0, 1, 1, "x"))
		takeAll(q)
	}
	if len(q.counters) > 3 {
		t.Fatalf("%d counters kept with MaxTenants 3", len(q.counters))
	}
}

// FuzzQueue drives the queue with any sequence of pushes, removals,
// dispatches (with skips, drops and stops) and charges, and checks the
// invariants after each step against a plain list of what is queued:
// nothing is lost or dispatched twice, the counts and bounds hold, every
// taken item had the highest priority among those the callback would
// have taken (within the ScanPerTenant items a pass looks at per tenant),
// and within its band its tenant had the least counter among the tenants
// with such an item.
func FuzzQueue(f *testing.F) {
	f.Add([]byte{0x01, 0x22, 0x43, 0x84, 0xc5, 0x06, 0x87, 0xff})
	f.Add([]byte("push push dispatch remove charge dispatch stop"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, ops []byte) {
		lim := Limits{MaxItems: 12, MaxBytes: 400, MaxItemsPerTenant: 5, MaxBytesPerTenant: 200, MaxTenants: 3, ScanPerTenant: 2, ReturnCredit: len(ops) % 3}
		q := New[req](lim)
		rng := rand.New(rand.NewPCG(uint64(len(ops)), 7))
		live := map[*Item[req]]bool{}
		done := map[*Item[req]]bool{}
		var all []*Item[req]
		// vt models the virtual time: the largest counter a request
		// started at, taken from the queue or started at once.
		vt := 0.0
		for step, op := range ops {
			switch op & 3 {
			case 0: // push
				it := &Item[req]{Tenant: fmt.Sprint("t", op>>2&3), Priority: int(op>>4&3) - 1,
					Deadline: int64(rng.IntN(20)), Bytes: int64(op>>6) * 30, Cost: int64(rng.IntN(100))}
				// A tenant with nothing queued starts at the virtual time,
				// or at its band's least backlogged counter if lower, less
				// ReturnCredit requests of the size of this one, unless its
				// own counter is higher.
				want, backlogged, lo, have := q.Served(it.Tenant), false, 0.0, false
				for o := range live {
					if o.Tenant == it.Tenant {
						backlogged = true
					}
					if o.Priority != it.Priority {
						continue
					}
					if s := q.Served(o.Tenant); !have || s < lo {
						lo, have = s, true
					}
				}
				if !backlogged {
					to := vt
					if have && lo < to {
						to = lo
					}
					want = max(want, to-float64(int64(lim.ReturnCredit)*it.Cost))
				}
				if err := q.Push(it); err == nil {
					live[it] = true
					all = append(all, it)
					if got := q.Served(it.Tenant); got != want {
						t.Fatalf("step %d: %s at %v after its push, want %v", step, it.Tenant, got, want)
					}
				} else if _, ok := err.(*ErrFull); !ok {
					t.Fatalf("step %d: push: %v", step, err)
				}
			case 1: // remove a random known item
				if len(all) > 0 {
					it := all[rng.IntN(len(all))]
					if q.Remove(it) != live[it] {
						t.Fatalf("step %d: Remove disagrees with the model", step)
					}
					delete(live, it)
				}
			case 2: // dispatch with a random eligibility
				ok := func(it *Item[req]) bool { return (it.Deadline+int64(op))%3 != 0 }
				// offerable: eligible and within the first ScanPerTenant of
				// its tenant's items, the window a pass looks at.
				offerable := func(it *Item[req]) bool {
					if !ok(it) {
						return false
					}
					ahead := 0
					for o := range live {
						if o.Priority == it.Priority && o.Tenant == it.Tenant && cmpItem(o, it) < 0 {
							ahead++
						}
					}
					return ahead < lim.ScanPerTenant
				}
				stopAfter := int(op>>2) % 4
				n := 0
				// DispatchLast: the policy's order reversed between
				// tenants (a slot whose request may wait in the engine).
				last := op&0x40 != 0
				dispatch := q.Dispatch
				if last {
					dispatch = q.DispatchLast
				}
				dispatch(int(op>>4), func(it *Item[req]) Verdict {
					if !live[it] || done[it] {
						t.Fatalf("step %d: offered an item not queued", step)
					}
					if n >= stopAfter {
						return Stop
					}
					switch {
					case !ok(it):
						return Skip
					case it.Cost == 13:
						delete(live, it)
						done[it] = true
						return Dropped
					}
					// The best offerable item is of the highest priority,
					// and in its band of a tenant with the least counter;
					// for DispatchLast the lowest, and the greatest.
					for o := range live {
						if o == it || !offerable(o) {
							continue
						}
						if last {
							if o.Priority < it.Priority {
								t.Fatalf("step %d: last took priority %d while an offerable %d waits", step, it.Priority, o.Priority)
							}
							if o.Priority == it.Priority && o.Tenant != it.Tenant && q.Served(o.Tenant) > q.Served(it.Tenant) {
								t.Fatalf("step %d: last took %s (served %v) before %s (served %v)", step, it.Tenant, q.Served(it.Tenant), o.Tenant, q.Served(o.Tenant))
							}
							continue
						}
						if o.Priority > it.Priority {
							t.Fatalf("step %d: took priority %d while an offerable %d waits", step, it.Priority, o.Priority)
						}
						if o.Priority == it.Priority && o.Tenant != it.Tenant && q.Served(o.Tenant) < q.Served(it.Tenant) {
							t.Fatalf("step %d: took %s (served %v) before %s (served %v)", step, it.Tenant, q.Served(it.Tenant), o.Tenant, q.Served(o.Tenant))
						}
					}
					n++
					delete(live, it)
					done[it] = true
					vt = max(vt, q.Served(it.Tenant)) // charged after the callback
					return Taken
				})
			case 3:
				// A report of a request dispatched now or before the
				// tenant's last lift.
				name := fmt.Sprint("t", op>>2&3)
				q.ChargeSince(name, int64(op>>4&7)*40-100, q.Epoch(name)-uint64(op>>7))
				q.Started(name) // its next request starts at once
				vt = max(vt, q.Served(name))
			}
			// Invariants.
			var bytes int64
			perTenant := map[string]int{}
			for it := range live {
				if !it.Queued() {
					t.Fatalf("step %d: live item not queued", step)
				}
				bytes += it.Bytes
				perTenant[fmt.Sprint(it.Priority, it.Tenant)]++
			}
			if q.Len() != len(live) || q.Bytes() != bytes {
				t.Fatalf("step %d: queue %d items %d bytes, model %d %d", step, q.Len(), q.Bytes(), len(live), bytes)
			}
			if q.Len() > lim.MaxItems || q.Bytes() > lim.MaxBytes {
				t.Fatalf("step %d: bounds exceeded: %d items %d bytes", step, q.Len(), q.Bytes())
			}
			for k, n := range perTenant {
				if n > lim.MaxItemsPerTenant {
					t.Fatalf("step %d: %s has %d items", step, k, n)
				}
			}
			seen := 0
			q.Each(func(it *Item[req]) {
				seen++
				if !live[it] {
					t.Fatalf("step %d: queue holds an item the model does not", step)
				}
			})
			if seen != len(live) {
				t.Fatalf("step %d: Each saw %d of %d", step, seen, len(live))
			}
			for _, c := range q.counters {
				if c.served < 0 || c.queued < 0 || c.absorb < 0 {
					t.Fatalf("step %d: counter %+v", step, c)
				}
			}
		}
	})
}
