package remote

import (
	"slices"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// reports queues completion reports for the control plane. The flush
// tick sends only the aged ones, those already queued at the tick before,
// so that a report waits one to two intervals (one put back after a failed
// call only until the next tick):
// time for a Route call to carry it instead (riders), and, for the report
// of an abandoned call, for the call it names to reach the leader first.
// Not safe for concurrent use: the Router's mu guards it.
type reports struct {
	q    []*cartv1.Completion
	aged int // how many of q's oldest were queued at the last tick, or put back
}

func (r *reports) add(c *cartv1.Completion) { r.q = append(r.q, c) }

func (r *reports) len() int { return len(r.q) }

// take removes and returns the oldest n (at most all), in a slice of its
// own: a message that may still be waiting to be sent holds it.
func (r *reports) take(n int) []*cartv1.Completion {
	n = min(n, len(r.q))
	if n == 0 {
		return nil
	}
	out := slices.Clone(r.q[:n])
	r.q = slices.Delete(r.q, 0, n)
	r.aged = max(0, r.aged-n)
	return out
}

// putBack returns reports a failed call carried, ahead of those queued
// since and counted as aged: the next tick sends them unless a call
// carries them first. cs is not written to.
func (r *reports) putBack(cs []*cartv1.Completion) {
	r.q = slices.Concat(cs, r.q)
	r.aged += len(cs)
}

// due removes and returns the aged reports, or all of them when all is
// set.
func (r *reports) due(all bool) []*cartv1.Completion {
	n := r.aged
	if all {
		n = len(r.q)
	}
	return r.take(n)
}

// tick marks every queued report aged: the flush tick's, after it took
// what was due.
func (r *reports) tick() { r.aged = len(r.q) }
