// Package coalesce sends items that become ready together as one message.
//
// A Sender has no timer and never waits to fill a message: a caller whose
// item finds no send in progress sends it at once, alone, exactly as
// without coalescing. Only items that arrive while a send is in progress
// are queued, and the next send carries all of them (up to a bound). So
// at low load every item goes out immediately, and under concurrency the
// per-message costs (a write syscall, a frame, an envelope) are paid once
// per batch instead of once per item.
//
// A caller that becomes the sender does at most Rounds sends before
// handing what is still queued to a goroutine of its own, so no caller is
// held for long by others' items, and nothing is ever left in the queue
// with no one to send it.
package coalesce

import (
	"errors"
	"sync"
)

// ErrClosed is what Send returns after Close.
var ErrClosed = errors.New("coalesce: sender closed")

// Options configure a Sender.
type Options[T any] struct {
	// Max is the most items in one send (default 1: no coalescing, one
	// send per item, in order).
	Max int
	// Cost and MaxCost bound a send by the items' summed cost (for
	// example their encoded size, under a peer's message size limit): an
	// item joins a send only if the sum stays within MaxCost. The first
	// item of a send always goes, whatever its cost. Nil or 0: no bound.
	// Cost runs in Send before the item is queued, outside the Sender's
	// lock (an encoded size can take a while, and would hold up every
	// other Send meanwhile), so the item must not change once sent.
	Cost    func(T) int
	MaxCost int
	// Rounds is the most sends a caller makes before it hands the queue to
	// a goroutine (default 2: its own item, then what queued meanwhile).
	Rounds int
	// Queue bounds the items waiting: past it, Send waits for room, which
	// pushes back on the producers while the peer is slow to read
	// (default 1024).
	Queue int
	// Failed is told the first error a send returned (once, from the
	// goroutine whose send failed, after the Sender stopped and before
	// Close may return): the items then queued are dropped, and every
	// later Send fails with it. It must not call Close.
	Failed func(error)
}

// Sender coalesces items into sends. Its methods are safe for concurrent
// use; flush is never called concurrently with itself.
type Sender[T any] struct {
	flush   func([]T) error
	o       Options[T]
	mu      sync.Mutex
	cond    sync.Cond // busy turned false, or the queue got room
	max     int
	costed  bool // Cost bounds a send
	q       []queued[T]
	buf     []T // the batch being sent; owned by the sender of the moment
	busy    bool
	waiting int // Sends waiting for room, or Close for idle
	err     error
	closed  bool
}

// queued is an item waiting for a send, with its cost when costed.
type queued[T any] struct {
	v    T
	cost int
}

// New returns a Sender that sends a batch with flush. flush gets the
// items in the order they were queued, at least one; it must not keep
// the slice after it returns.
func New[T any](flush func([]T) error, o Options[T]) *Sender[T] {
	if o.Max <= 0 {
		o.Max = 1
	}
	if o.Rounds <= 0 {
		o.Rounds = 2
	}
	if o.Queue <= 0 {
		o.Queue = 1024
	}
	s := &Sender[T]{flush: flush, o: o, max: o.Max, costed: o.Cost != nil && o.MaxCost > 0}
	s.cond.L = &s.mu
	return s
}

// SetMax changes the most items in one send, from the next one on (a
// peer that declared late that it reads batches).
func (s *Sender[T]) SetMax(n int) {
	s.mu.Lock()
	s.max = max(n, 1)
	s.mu.Unlock()
}

// Send queues m for the next send, and sends it (and what queues
// meanwhile) itself when no send is in progress. It returns once m was
// sent or handed to the sender of the moment; an error only if the
// Sender had stopped (m is then not sent) or this call's own send failed.
// An item handed over and then lost to another's failed send is reported
// through Options.Failed, not here.
func (s *Sender[T]) Send(m T) error {
	cost := 0
	if s.costed {
		cost = s.o.Cost(m)
	}
	return s.SendCost(m, cost)
}

// SendCost is Send for a caller that knows m's cost already (what
// Options.Cost would return), which is then not called.
func (s *Sender[T]) SendCost(m T, cost int) error {
	it := queued[T]{v: m, cost: cost}
	s.mu.Lock()
	for s.err == nil && !s.closed && len(s.q) >= s.o.Queue {
		s.waiting++
		s.cond.Wait()
		s.waiting--
	}
	if s.err != nil || s.closed {
		err := s.err
		if err == nil {
			err = ErrClosed
		}
		s.mu.Unlock()
		return err
	}
	s.q = append(s.q, it)
	if s.busy {
		s.mu.Unlock()
		return nil
	}
	s.busy = true
	s.mu.Unlock()
	return s.drain(s.o.Rounds)
}

// drain sends batches until the queue is empty, or hands it to a goroutine
// after rounds sends (rounds 0: no limit). The caller set busy.
func (s *Sender[T]) drain(rounds int) error {
	for n := 0; ; n++ {
		s.mu.Lock()
		if len(s.q) == 0 || s.err != nil {
			s.idle()
			s.mu.Unlock()
			return nil
		}
		if rounds > 0 && n == rounds {
			s.mu.Unlock()
			go func() { _ = s.drain(0) }() // busy passes to it
			return nil
		}
		batch := s.take()
		s.mu.Unlock()
		err := s.flush(batch)
		clear(batch) // drop the references until the buffer is reused
		if err != nil {
			s.mu.Lock()
			s.err = err
			clear(s.q)
			s.q = s.q[:0]
			s.cond.Broadcast() // Sends waiting for room fail now
			s.mu.Unlock()
			// Still busy while Failed runs, so that Close returns only
			// after the owner heard of the failure.
			if s.o.Failed != nil {
				s.o.Failed(err)
			}
			s.mu.Lock()
			s.idle()
			s.mu.Unlock()
			return err
		}
	}
}

// take removes the next batch from the queue. mu is held.
func (s *Sender[T]) take() []T {
	n, cost := 1, s.q[0].cost
	for n < len(s.q) && n < s.max {
		if s.costed {
			if cost+s.q[n].cost > s.o.MaxCost {
				break
			}
			cost += s.q[n].cost
		}
		n++
	}
	s.buf = s.buf[:0]
	for _, it := range s.q[:n] {
		s.buf = append(s.buf, it.v)
	}
	rest := copy(s.q, s.q[n:])
	clear(s.q[rest:])
	s.q = s.q[:rest]
	if s.waiting > 0 {
		s.cond.Broadcast()
	}
	return s.buf
}

// idle marks no send in progress. mu is held.
func (s *Sender[T]) idle() {
	s.busy = false
	if s.waiting > 0 {
		s.cond.Broadcast()
	}
}

// Queued is how many items wait for a send (not counting one in progress).
func (s *Sender[T]) Queued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.q)
}

// Err is the error that stopped the Sender, or nil.
func (s *Sender[T]) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Close refuses later Sends and returns once everything queued before it
// was sent (or dropped by a failed send) and no send is in progress: the
// peer may be given up after it. It returns the error that stopped the
// Sender, if any.
func (s *Sender[T]) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.cond.Broadcast() // Sends waiting for room give up
	for s.busy {
		s.waiting++
		s.cond.Wait()
		s.waiting--
	}
	return s.err
}
