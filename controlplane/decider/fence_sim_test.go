package decider

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// fenceSim is one data plane and the leader's decider with every message
// between them in flight for a random while and delivered in any order
// (a stream does not order the leader's work): Route calls (with riders),
// their answers, report batches, their acknowledgements, and Syncs (one
// at a time, as a data plane sends them). The data plane gives up on
// calls (abandon reports), finishes requests at random and takes its
// Sync's counts and fence at random instants. Report batches and Syncs
// also fail on the data plane's side: a failed batch is queued again and
// its message arrives late or never; a failed Sync lets the next one go
// at once, and arrives late, twice or never.
type fenceSim struct {
	t    *testing.T
	seed uint64
	rng  *rand.Rand
	d    *Decider

	// Data plane.
	lastRoute uint64
	open      map[uint64][]Completion // calls without an answer → their riders
	local     map[string]int
	held      []heldReq
	queue     []Completion         // completions: they ride with calls or go in a report batch
	abandons  []Completion         // abandon reports: only in report batches, as the data plane sends them
	sent      map[int][]Completion // report batches in flight
	doneSeq   uint64
	syncSeq   uint64
	syncing   bool
	nextBatch int

	// In flight. A report batch naming an abandoned call is not delivered
	// before that call: the data plane ages abandon reports so that they
	// do not overtake their calls (an overtaken one leaves a ticket no
	// report releases, for the stale rule).
	toLeader []msg
	toDP     []func()
	decided  map[uint64]bool // route ids the leader has processed

	logf func(string, ...any) // nil: quiet

	// The leader's tickets whose release is still to come, per worker:
	// what its load must be at every instant.
	live map[uint64]string
}

type msg struct {
	deliver func()
	ready   func() bool // nil: any time
}

type heldReq struct {
	ticket uint64
	worker string
}

func newFenceSim(t *testing.T, seed uint64) *fenceSim {
	now := time.Unix(1000, 0)
	d := newTestDecider(&now, 1<<16, -1)
	d.Lead(true)
	return &fenceSim{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 1)), d: d, lastRoute: 100,
		open: map[uint64][]Completion{}, local: map[string]int{}, sent: map[int][]Completion{}, live: map[uint64]string{}, decided: map[uint64]bool{}}
}

func (s *fenceSim) log(format string, a ...any) {
	if s.logf != nil {
		s.logf(format, a...)
	}
}

// takeOne removes and returns a random element of q.
func takeOne(rng *rand.Rand, q *[]func()) func() {
	i := rng.IntN(len(*q))
	f := (*q)[i]
	*q = slices.Delete(*q, i, i+1)
	return f
}

// deliverOne delivers a random message to the leader among those ready,
// and reports whether there was one.
func (s *fenceSim) deliverOne() bool {
	var ready []int
	for i, m := range s.toLeader {
		if m.ready == nil || m.ready() {
			ready = append(ready, i)
		}
	}
	if len(ready) == 0 {
		return false
	}
	i := ready[s.rng.IntN(len(ready))]
	m := s.toLeader[i]
	s.toLeader = slices.Delete(s.toLeader, i, i+1)
	m.deliver()
	return true
}

func (s *fenceSim) call() {
	s.lastRoute++
	r := s.lastRoute
	var riders []Completion
	if s.rng.IntN(2) == 0 {
		riders, s.queue = s.queue, nil
	}
	s.open[r] = riders
	s.log("dp: call %d riders %v", r, riders)
	w := []string{"a", "b"}[s.rng.IntN(2)]
	s.toLeader = append(s.toLeader, msg{deliver: func() {
		s.decided[r] = true
		rq := req(fmt.Sprintf("call %d", r))
		rq.PinTo = w
		for _, c := range riders {
			delete(s.live, c.Ticket)
		}
		dec, err := s.d.DecideFor(context.Background(), Caller{DataPlane: "x", RouteID: r, Settle: riders}, rq)
		if err != nil {
			s.t.Fatal(err)
		}
		s.live[dec.Ticket.ID] = dec.Worker
		s.log("leader: route %d -> ticket %d on %s (riders %v)", r, dec.Ticket.ID, dec.Worker, riders)
		s.toDP = append(s.toDP, func() {
			if _, ok := s.open[r]; !ok {
				return // given up on: its abandon report releases it
			}
			s.log("dp: answer %d ticket %d", r, dec.Ticket.ID)
			delete(s.open, r)
			s.local[dec.Worker]++
			s.held = append(s.held, heldReq{dec.Ticket.ID, dec.Worker})
		})
	}})
}

func (s *fenceSim) giveUp() {
	for r, riders := range s.open {
		s.log("dp: give up %d", r)
		delete(s.open, r)
		// Riders go back: they may not have arrived.
		s.queue = append(slices.Clone(riders), s.queue...)
		s.abandons = append(s.abandons, Completion{Abandoned: true, RouteID: r})
		return
	}
}

func (s *fenceSim) finish() {
	i := s.rng.IntN(len(s.held))
	h := s.held[i]
	s.held = slices.Delete(s.held, i, i+1)
	s.local[h.worker]--
	s.doneSeq++
	s.log("dp: finish ticket %d seq %d", h.ticket, s.doneSeq)
	s.queue = append(s.queue, Completion{Ticket: h.ticket, Worker: h.worker, DoneSeq: s.doneSeq, Outcome: Outcome{Delivered: true}})
}

func (s *fenceSim) report() {
	batch := append(s.queue, s.abandons...)
	s.queue, s.abandons = nil, nil
	s.nextBatch++
	id := s.nextBatch
	s.sent[id] = batch
	ready := func() bool {
		for _, c := range batch {
			if c.Abandoned && !s.decided[c.RouteID] {
				return false
			}
		}
		return true
	}
	// deliver settles the batch on the leader; awaited: the data plane
	// still waits for the answer.
	deliver := func(awaited bool) func() {
		return func() {
			for _, c := range batch {
				if !c.Abandoned {
					delete(s.live, c.Ticket)
				} else if tid, ok := s.d.lead.byRoute[routeKey{"x", c.RouteID}]; ok {
					delete(s.live, tid)
				}
			}
			s.log("leader: reports %v (answer awaited: %v)", batch, awaited)
			s.d.Complete("x", batch)
			if awaited {
				s.toDP = append(s.toDP, func() { delete(s.sent, id) })
			}
		}
	}
	awaited := true
	if s.rng.IntN(4) == 0 {
		// The call fails on the data plane (a timeout): the batch is
		// queued again, and the message reaches the leader later, or
		// never.
		s.log("dp: report batch %d failed", id)
		delete(s.sent, id)
		for _, c := range batch {
			if c.Abandoned {
				s.abandons = append(s.abandons, c)
			} else {
				s.queue = append(s.queue, c)
			}
		}
		if s.rng.IntN(2) == 0 {
			return
		}
		awaited = false
	}
	s.toLeader = append(s.toLeader, msg{ready: ready, deliver: deliver(awaited)})
}

func (s *fenceSim) sync() {
	s.syncing = true
	counts := map[string]int{}
	for w, n := range s.local {
		if n > 0 {
			counts[w] = n
		}
	}
	s.syncSeq++
	f := SyncFence{FirstRouteID: 101, SyncSeq: s.syncSeq, LastRouteID: s.lastRoute, DoneSeq: s.doneSeq}
	unsettled := func(cs []Completion) {
		for _, c := range cs {
			if c.Abandoned {
				f.OpenRoutes = append(f.OpenRoutes, c.RouteID)
			} else {
				f.Unsettled = append(f.Unsettled, c.Ticket)
			}
		}
	}
	for r, riders := range s.open {
		f.OpenRoutes = append(f.OpenRoutes, r)
		unsettled(riders)
	}
	unsettled(s.queue)
	unsettled(s.abandons)
	for _, b := range s.sent {
		unsettled(b)
	}
	s.log("dp: sync snapshot counts %v fence %+v", counts, f)
	apply := func() {
		s.log("leader: sync %v %+v", counts, f)
		s.d.SyncLoads("x", 0, counts, 0, f)
	}
	if s.rng.IntN(4) == 0 {
		// The call fails on the data plane (a timeout, or a broken stream
		// and the same Sync sent again unary): the next Sync may go at
		// once, and this one reaches the leader late, twice, or never.
		s.log("dp: sync %d failed", f.SyncSeq)
		s.syncing = false
		for range s.rng.IntN(3) {
			s.toLeader = append(s.toLeader, msg{deliver: apply})
		}
		return
	}
	s.toLeader = append(s.toLeader, msg{deliver: func() {
		apply()
		s.toDP = append(s.toDP, func() { s.syncing = false })
	}})
}

// check: the leader's load on each worker is exactly its tickets whose
// release is still to come.
func (s *fenceSim) check(step int) {
	want := map[string]int{}
	for _, w := range s.live {
		want[w]++
	}
	for _, w := range []string{"a", "b"} {
		if got := s.d.Load(w); got != want[w] {
			s.t.Fatalf("seed %d, step %d: leader's load on %s = %d, want %d (its tickets still to be released)", s.seed, step, w, got, want[w])
		}
	}
}

func (s *fenceSim) run(steps int) {
	for step := range steps {
		switch k := s.rng.IntN(9); {
		case k == 0:
			s.call()
		case k == 1 && len(s.open) > 0 && s.rng.IntN(4) == 0:
			s.giveUp()
		case k == 2 && len(s.held) > 0:
			s.finish()
		case k == 3 && len(s.queue)+len(s.abandons) > 0:
			s.report()
		case k == 4 && !s.syncing:
			s.sync()
		case k <= 6 && s.deliverOne():
		case len(s.toDP) > 0:
			takeOne(s.rng, &s.toDP)()
		}
		s.check(step)
	}
	// Drain: every request finishes, every message arrives, a last Sync.
	for len(s.open)+len(s.held)+len(s.queue)+len(s.abandons)+len(s.toLeader)+len(s.toDP) > 0 || s.syncing {
		switch {
		case len(s.toDP) > 0:
			takeOne(s.rng, &s.toDP)()
		case s.deliverOne():
		case len(s.open) > 0:
			s.giveUp()
		case len(s.held) > 0:
			s.finish()
		case len(s.queue)+len(s.abandons) > 0:
			s.report()
		}
		s.check(steps)
	}
	s.sync()
	s.deliverOne()
	s.check(steps)
	if s.d.Load("a")+s.d.Load("b") != 0 {
		s.t.Fatal("load left at the end")
	}
}

// With every interleaving of a data plane's messages the simulation
// draws, the leader's load after each step, Syncs included, is exactly its
// tickets still to be released: a Sync's fence makes up for what its
// counts could not include, and no report is released twice.
func TestSyncFenceUnderRandomInterleavings(t *testing.T) {
	for seed := range uint64(300) {
		newFenceSim(t, seed).run(400)
	}
}
