package decider

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
)

// ticketFor issues a tracked decision for data plane dp pinned to worker w.
func ticketFor(t *testing.T, d *Decider, dp, w, text string) uint64 {
	t.Helper()
	return ticketForID(t, d, dp, w, text, 0)
}

// The stale rule settles, per (data plane, worker), the oldest tickets past
// the lease beyond what the data plane still counts in flight; young
// tickets, other pairs and counted ones stay. A data plane whose lease
// lapses loses exactly its own tickets.
func TestSweepSettlesOldestExcessPerPair(t *testing.T) {
	now := time.Unix(1000, 0)
	d := newTestDecider(&now, 1000, -1)
	d.o.LoadLease = 10 * time.Second
	d.Lead(true)
	old := []uint64{ticketFor(t, d, "x", "a", "x a one"), ticketFor(t, d, "x", "a", "x a two"), ticketFor(t, d, "x", "a", "x a three")}
	yb := []uint64{ticketFor(t, d, "y", "b", "y b one"), ticketFor(t, d, "y", "b", "y b two")}
	now = now.Add(8 * time.Second)
	young := ticketFor(t, d, "x", "a", "x a young")
	d.SyncLoads("x", 0, map[string]int{"a": 2}, 0, SyncFence{})
	d.SyncLoads("y", 0, map[string]int{"b": 2}, 0, SyncFence{})

	now = now.Add(3 * time.Second) // the first five are past the lease
	if exp := d.Sweep(); len(exp) != 0 {
		t.Fatalf("expired %v, want none", exp)
	}
	// x/a: 4 live, 2 counted: the two oldest go, the third old one and the
	// young one stay. y/b: 2 live, 2 counted: nothing goes.
	if got := d.Dropped(DropStale); got != 2 {
		t.Fatalf("stale drops = %d, want 2", got)
	}
	if got := d.Stats().Unsettled; got != 4 {
		t.Fatalf("unsettled = %d, want 4", got)
	}
	for i, c := range []struct {
		dp, w  string
		ticket uint64
		want   int
	}{{"x", "a", old[0], 0}, {"x", "a", old[1], 0}, {"x", "a", old[2], 1}, {"x", "a", young, 1}} {
		if n := d.Complete(c.dp, []Completion{{Ticket: c.ticket, Worker: c.w, Outcome: Outcome{Delivered: true}}}); n != c.want {
			t.Errorf("case %d: completing ticket settled %d, want %d", i, n, c.want)
		}
	}

	// y stops syncing; x keeps syncing: y's lease lapses, its two go.
	now = now.Add(11 * time.Second)
	d.SyncLoads("x", 0, map[string]int{}, 0, SyncFence{})
	if exp := d.Sweep(); len(exp) != 1 || exp[0] != "y" {
		t.Fatalf("expired %v, want [y]", exp)
	}
	if got := d.Stats().Unsettled; got != 0 {
		t.Fatalf("unsettled after y lapsed = %d, want 0", got)
	}
	if n := d.Complete("y", []Completion{{Ticket: yb[0], Worker: "b"}, {Ticket: yb[1], Worker: "b"}}); n != 0 {
		t.Fatalf("a lapsed data plane's tickets settled %d", n)
	}
}

// Settling in any order keeps the issue-order lists consistent: the cap
// always drops the oldest live ticket.
func TestTicketCapAfterOutOfOrderSettles(t *testing.T) {
	now := time.Unix(1000, 0)
	d := newTestDecider(&now, 1000, -1)
	d.o.MaxTickets = 3
	d.Lead(true)
	ids := make([]uint64, 4)
	for i := range ids {
		ids[i] = ticketFor(t, d, "x", "a", fmt.Sprintf("prompt %d", i))
	}
	// The cap dropped ids[0]. Settle ids[2], then issue two more: the
	// first fits, the second makes the cap drop ids[1], the oldest still
	// live (not ids[2], settled already, nor a later one).
	if n := d.Complete("x", []Completion{{Ticket: ids[2], Worker: "a"}}); n != 1 {
		t.Fatalf("settled %d, want 1", n)
	}
	a, b := ticketFor(t, d, "x", "a", "prompt 4"), ticketFor(t, d, "x", "a", "prompt 5")
	if got := d.Dropped(DropCap); got != 2 {
		t.Fatalf("cap drops = %d, want 2", got)
	}
	live := map[uint64]bool{}
	for _, id := range []uint64{ids[0], ids[1], ids[3], a, b} {
		live[id] = d.Complete("x", []Completion{{Ticket: id, Worker: "a"}}) == 1
	}
	want := map[uint64]bool{ids[0]: false, ids[1]: false, ids[3]: true, a: true, b: true}
	for id, w := range want {
		if live[id] != w {
			t.Errorf("ticket %d live = %v, want %v", id, live[id], w)
		}
	}
}

// BenchmarkSweep is the periodic sweep with many live tickets, none stale:
// it must not walk them under the lock (it did: 36 ms at 100k).
func BenchmarkSweep(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			d := New(Options{
				Policy:     engine.Policy{Threshold: 0.5, BalanceAbsThreshold: 1 << 30, BalanceRelThreshold: 1 << 30, BlockChars: 64},
				MaxEntries: 1 << 16, InlineEvict: true, Rand: rand.New(rand.NewPCG(1, 2)), LoadLease: 5 * time.Second,
			})
			var ws []engine.WorkerSpec
			for i := range 8 {
				ws = append(ws, engine.WorkerSpec{URL: fmt.Sprintf("http://w%d", i)})
			}
			d.SetWorkers(ws)
			d.Lead(true)
			for i := range n {
				text := fmt.Sprintf("q %d %0128d", i, i)
				r := Request{Request: engine.Request{Hashes: index.Hash(nil, "m", []byte(text), 64), KeyLen: len(text)}}
				if _, err := d.DecideFor(context.Background(), Caller{DataPlane: fmt.Sprint("dp", i%4), RouteID: uint64(i + 1)}, r); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for range b.N {
				d.Sweep()
			}
		})
	}
}

// Settlements that come with a decision are applied in its own lock hold,
// before it, up to completeChunk; the rest in Complete's chunks after it.
// They stand even when the decision fails.
func TestRouteForSettlesWhatCameWithIt(t *testing.T) {
	now := time.Unix(1000, 0)
	d := newTestDecider(&now, 1<<16, -1)
	d.Lead(true)
	n := completeChunk + 2
	cs := make([]Completion, n)
	for i := range cs {
		cs[i] = Completion{Ticket: ticketFor(t, d, "x", "a", fmt.Sprintf("prompt %d", i)), Worker: "a", Outcome: Outcome{Delivered: true}}
	}
	// "a" is full: only settling before deciding makes room for one more.
	d.SetWorkers([]engine.WorkerSpec{{URL: "a", MaxLoad: n}, {URL: "b"}})
	settles, routes := holdCount(t, d, OpSettle), holdCount(t, d, OpRoute)
	r := req("one more")
	r.PinTo = "a"
	if _, err := d.DecideFor(context.Background(), Caller{DataPlane: "x", Settle: cs[:completeChunk]}, r); err != nil {
		t.Fatalf("a decision whose riders free its worker: %v", err)
	}
	if got := d.Load("a"); got != n-completeChunk+1 {
		t.Fatalf("load %d after a decision that settled %d of %d, want %d", got, completeChunk, n, n-completeChunk+1)
	}
	if s, r := holdCount(t, d, OpSettle)-settles, holdCount(t, d, OpRoute)-routes; s != 0 || r != 1 {
		t.Fatalf("%d settle and %d route lock holds, want the decision's one", s, r)
	}
	// More than a chunk: the rest after the decision, in a hold of its
	// own; and a decision that fails (a pin to a worker that left) still
	// settles.
	bad := req("pinned to nobody")
	bad.PinTo = "gone"
	all := append(slices.Clone(cs), cs[:completeChunk]...) // settled twice: no-ops
	if _, err := d.DecideFor(context.Background(), Caller{DataPlane: "x", Settle: all}, bad); err == nil {
		t.Fatal("a decision pinned to an unknown worker must fail")
	}
	if got := d.Load("a"); got != 1 {
		t.Fatalf("load %d, want only the last decision's", got)
	}
	rest := len(all) - completeChunk
	if s, want := holdCount(t, d, OpSettle)-settles, uint64((rest+completeChunk-1)/completeChunk); s != want {
		t.Fatalf("%d settle lock holds for the %d beyond the decision's chunk, want %d", s, rest, want)
	}
}

// A large completion batch is settled in bounded lock holds, all of it.
func TestCompleteSettlesInChunks(t *testing.T) {
	now := time.Unix(1000, 0)
	d := newTestDecider(&now, 1<<16, -1)
	d.Lead(true)
	n := 2*completeChunk + 2
	cs := make([]Completion, n)
	for i := range cs {
		cs[i] = Completion{Ticket: ticketFor(t, d, "x", "a", fmt.Sprintf("prompt %d", i)), Worker: "a", Outcome: Outcome{Delivered: true}}
	}
	before := holdCount(t, d, OpSettle)
	if got := d.Complete("x", cs); got != n {
		t.Fatalf("settled %d, want %d", got, n)
	}
	if holds := holdCount(t, d, OpSettle) - before; holds != 3 {
		t.Fatalf("settle lock holds = %d, want 3 (chunks of %d)", holds, completeChunk)
	}
	if got := d.Stats().Unsettled; got != 0 || d.Load("a") != 0 {
		t.Fatalf("after the batch: unsettled %d, load %d", got, d.Load("a"))
	}
}

// leadingDecider is a test decider that leads, its clock stopped.
func leadingDecider() *Decider {
	now := time.Unix(1000, 0)
	d := newTestDecider(&now, 1000, -1)
	d.Lead(true)
	return d
}

// ticketForID is ticketFor with the data plane's route id.
func ticketForID(t *testing.T, d *Decider, dp, w, text string, route uint64) uint64 {
	t.Helper()
	r := req(text)
	r.PinTo = w
	dec, err := d.DecideFor(context.Background(), Caller{DataPlane: dp, RouteID: route}, r)
	if err != nil {
		t.Fatal(err)
	}
	return dec.Ticket.ID
}

// A Sync's counts are taken at one instant on the data plane; its fence
// says what they could not include yet, so the leader's count after it is
// every decision whose load a later message will release, no more: each
// report then takes exactly one off, down to zero. Without the fence the
// Sync would set 2 and the reports would hit the floor.
func TestSyncFenceCountsWhatReportsWillRelease(t *testing.T) {
	d := leadingDecider()
	d.SyncLoads("x", 0, map[string]int{}, 0, SyncFence{FirstRouteID: 1, SyncSeq: 1, LastRouteID: 9})
	delivered := Outcome{Delivered: true}

	held := ticketForID(t, d, "x", "a", "held one", 10)         // answered before the counts: in them
	open := ticketForID(t, d, "x", "a", "open one", 11)         // its answer still on its way
	unreported := ticketForID(t, d, "x", "a", "unreported", 12) // finished before the counts, report queued
	lateDone := ticketForID(t, d, "x", "a", "late done", 13)    // in the counts, then finished and reported before the Sync
	ticketForID(t, d, "x", "a", "abandoned", 14)                // given up on, abandon report queued
	openDone := ticketForID(t, d, "x", "a", "open done", 15)    // answer on its way, then finished and reported before the Sync
	other := ticketForID(t, d, "y", "a", "other dp", 1)         // another data plane's: not x's business
	// The data plane takes its counts here: held and lateDone in flight
	// on a, one finished request (unreported's, done_seq 1).
	after := ticketForID(t, d, "x", "a", "after one", 16)      // a call made after the counts
	afterDone := ticketForID(t, d, "x", "a", "after done", 17) // made, finished and reported after them
	if n := d.Complete("x", []Completion{
		{Ticket: lateDone, Worker: "a", DoneSeq: 2, Outcome: delivered},
		{Ticket: afterDone, Worker: "a", DoneSeq: 3, Outcome: delivered},
		{Ticket: openDone, Worker: "a", DoneSeq: 4, Outcome: delivered},
	}); n != 3 {
		t.Fatalf("settled %d, want 3", n)
	}
	d.SyncLoads("x", 0, map[string]int{"a": 2}, 0, SyncFence{FirstRouteID: 1, SyncSeq: 2, LastRouteID: 15, OpenRoutes: []uint64{11, 14, 15}, Unsettled: []uint64{unreported}, DoneSeq: 1})
	// held, open, unreported, abandoned and after for x; other for y.
	if got := d.Load("a"); got != 6 {
		t.Fatalf("load after the Sync = %d, want 6", got)
	}
	for i, c := range []Completion{
		{Ticket: unreported, Worker: "a", DoneSeq: 1, Outcome: delivered},
		{Abandoned: true, RouteID: 14},
		{Ticket: open, Worker: "a", DoneSeq: 5, Outcome: delivered},
		{Ticket: after, Worker: "a", DoneSeq: 6, Outcome: delivered},
		{Ticket: held, Worker: "a", DoneSeq: 7, Outcome: delivered},
	} {
		if n := d.Complete("x", []Completion{c}); n != 1 {
			t.Fatalf("report %d settled %d", i, n)
		}
		if got, want := d.Load("a"), 6-1-i; got != want {
			t.Fatalf("load after report %d = %d, want %d", i, got, want)
		}
	}
	d.Complete("y", []Completion{{Ticket: other, Worker: "a", Outcome: delivered}})
	// The next Sync, with nothing in flight and nothing pending.
	d.SyncLoads("x", 0, map[string]int{}, 0, SyncFence{FirstRouteID: 1, SyncSeq: 3, LastRouteID: 17, DoneSeq: 7})
	if got := d.Load("a"); got != 0 {
		t.Fatalf("load at the end = %d, want 0", got)
	}
}

// A Sync without a fence (an older data plane) is taken as it is.
func TestSyncWithoutFence(t *testing.T) {
	d := leadingDecider()
	ticketForID(t, d, "x", "a", "one", 10)
	ticketForID(t, d, "x", "a", "two", 11)
	d.SyncLoads("x", 0, map[string]int{"a": 1}, 0, SyncFence{OpenRoutes: []uint64{11}})
	if got := d.Load("a"); got != 1 {
		t.Fatalf("load = %d, want the Sync's 1", got)
	}
}

// A fence that names a ticket twice, or another data plane's, counts it
// once, or not at all.
func TestSyncFenceCountsEachTicketOnce(t *testing.T) {
	d := leadingDecider()
	d.SyncLoads("x", 0, nil, 0, SyncFence{FirstRouteID: 1, SyncSeq: 1, LastRouteID: 9})
	open := ticketForID(t, d, "x", "a", "open", 10)
	theirs := ticketForID(t, d, "y", "a", "theirs", 10)
	d.SyncLoads("x", 0, nil, 0, SyncFence{FirstRouteID: 1, SyncSeq: 2, LastRouteID: 10, OpenRoutes: []uint64{10, 10}, Unsettled: []uint64{open, open, theirs}})
	// x: open, once; y: theirs, from its own decision.
	if got := d.Load("a"); got != 2 {
		t.Fatalf("load = %d, want 2", got)
	}
}

// A data plane restarted under the same id starts its route ids at a new
// random point: its first Sync neither adds back the old process's
// decisions nor takes off its reports. A Sync not newer than the last
// applied is not applied.
func TestSyncFenceNewProcess(t *testing.T) {
	d := leadingDecider()
	const oldFirst, newFirst = 1 << 40, 5000
	d.SyncLoads("x", 0, nil, 0, SyncFence{FirstRouteID: oldFirst, SyncSeq: 1, LastRouteID: oldFirst - 1})
	held := ticketForID(t, d, "x", "a", "old held", oldFirst) // finished and reported after its last Sync
	ticketForID(t, d, "x", "a", "old unanswered", oldFirst+1) // the process died before the answer came
	d.Complete("x", []Completion{{Ticket: held, Worker: "a", DoneSeq: 1, Outcome: Outcome{Delivered: true}}})
	// The new process has two requests in flight on a, of its own.
	ticketForID(t, d, "x", "a", "new one", newFirst)
	ticketForID(t, d, "x", "a", "new two", newFirst+1)
	d.SyncLoads("x", 0, map[string]int{"a": 2}, 0, SyncFence{FirstRouteID: newFirst, SyncSeq: 1, LastRouteID: newFirst + 1})
	if got := d.Load("a"); got != 2 {
		t.Fatalf("load after the new process's first Sync = %d, want its 2", got)
	}
	// The same Sync again (a late copy, or sent again unary after the
	// stream broke), and an older one: neither is applied.
	d.SyncLoads("x", 0, map[string]int{"a": 2}, 0, SyncFence{FirstRouteID: newFirst, SyncSeq: 1, LastRouteID: newFirst + 1})
	d.SyncLoads("x", 0, map[string]int{"a": 5}, 0, SyncFence{FirstRouteID: newFirst, SyncSeq: 0, LastRouteID: newFirst})
	if got := d.Load("a"); got != 2 {
		t.Fatalf("load after repeated Syncs = %d, want 2", got)
	}
}
