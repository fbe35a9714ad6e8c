package service

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"connectrpc.com/connect"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
)

// maxStreamInFlight bounds the calls one stream has in progress on the
// leader. Past it the leader stops reading the stream, and HTTP/2 flow
// control pushes back on the data plane, which bounds its own in-flight
// calls below this anyway.
const maxStreamInFlight = 256

// streamScope tracks what ends every open stream: this node's current
// term as leader, and the API server's shutdown (a stream never ends on
// its own, so a graceful shutdown would wait for it until its deadline).
type streamScope struct {
	mu       sync.Mutex
	lead     chan struct{} // closed when the current leadership ends; nil when not leading
	shut     chan struct{}
	shutOnce sync.Once
}

func (s *streamScope) init() { s.shut = make(chan struct{}) }

// leading starts (leader) or ends (!leader) a term for the streams.
func (s *streamScope) leading(leader bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lead != nil {
		close(s.lead)
		s.lead = nil
	}
	if leader {
		s.lead = make(chan struct{})
	}
}

// current returns the channel that closes when the current leadership
// ends, or nil when not leading.
func (s *streamScope) current() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lead
}

// CloseStreams ends every open Stream call. Register it with the API
// server's RegisterOnShutdown so a graceful shutdown is not held up by
// data planes' long-lived streams (they reconnect to the next leader).
func (c *Core) CloseStreams() {
	c.streams.shutOnce.Do(func() { close(c.streams.shut) })
}

// streamNotLeader is the error that ends a stream on a node that is not (or no
// longer) the leader: the data plane reads the leader from its detail and
// reconnects there.
func (c *Core) streamNotLeader(why string) *connect.Error {
	id, _ := c.node.Leader()
	url := ""
	if id != "" {
		url = c.st.Members()[id]
	}
	return c.withLeader(connect.NewError(connect.CodeUnavailable, errors.New(why)), id, url)
}

// Stream implements RouterService.Stream: the leader's Route, Complete and
// Sync on one stream. Calls run concurrently (bounded by
// maxStreamInFlight) and are answered as they finish, so a slow one does
// not hold up the others.
func (h *RouterHandler) Stream(ctx context.Context, st *connect.BidiStream[cartv1.StreamRequest, cartv1.StreamResponse]) error {
	c := h.c
	lead := c.streams.current()
	if lead == nil || !c.node.IsLeader() {
		return c.streamNotLeader("node " + c.o.NodeID + " is not the leader: open the stream on the leader")
	}
	c.metrics.streams.Inc()
	defer c.metrics.streams.Dec()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var (
		sendMu  sync.Mutex
		sendErr error
		callsMu sync.Mutex
		closed  bool // no call may start: the handler is returning
		calls   sync.WaitGroup
	)
	send := func(r *cartv1.StreamResponse) {
		sendMu.Lock()
		defer sendMu.Unlock()
		if sendErr == nil {
			if sendErr = st.Send(r); sendErr != nil {
				cancel() // the data plane is gone: stop reading too
			}
		}
	}
	// begin counts a call (or the hello, or the feed) the handler must
	// wait for before it returns; false once it is returning.
	begin := func() bool {
		callsMu.Lock()
		defer callsMu.Unlock()
		if closed {
			return false
		}
		calls.Add(1)
		return true
	}
	slots := make(chan struct{}, maxStreamInFlight)
	recvDone := make(chan error, 1)
	go func() {
		feeding := false
		for {
			m, err := st.Receive()
			if err != nil {
				recvDone <- err
				return
			}
			if m.GetId() == 0 && m.GetCall() == nil {
				// The hello, answered here so that nothing the feed sends
				// can come before its answer. It counts as a call, so the
				// handler does not return while it sends.
				if !begin() {
					recvDone <- context.Canceled
					return
				}
				if m.GetPlacementFeed() != nil {
					// An empty frame acknowledges the feed: a data plane
					// whose leader predates it keeps recording its own
					// answers.
					send(&cartv1.StreamResponse{Result: &cartv1.StreamResponse_Placements{Placements: &cartv1.RecentPlacements{}}})
				} else {
					send(&cartv1.StreamResponse{})
				}
				if m.GetPlacementFeed() != nil && !feeding {
					feeding = true
					calls.Add(1) // while the hello's count is held: Wait has not returned
					go func() {
						defer calls.Done()
						c.feed(ctx, send)
					}()
				}
				calls.Done()
				continue
			}
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				recvDone <- ctx.Err()
				return
			}
			if !begin() {
				recvDone <- context.Canceled
				return
			}
			go func() {
				defer calls.Done()
				defer func() { <-slots }()
				send(c.streamCall(ctx, st.Peer().Protocol, m))
			}()
		}
	}()

	var err error
	select {
	case err = <-recvDone:
		if errors.Is(err, io.EOF) {
			err = nil // the data plane closed its side: a normal end
		}
	case <-lead:
		err = c.streamNotLeader("node " + c.o.NodeID + " stopped leading")
	case <-c.streams.shut:
		err = connect.NewError(connect.CodeUnavailable, errors.New("control-plane node shutting down"))
	}
	cancel()
	// Calls in progress finish (their contexts are cancelled, so the
	// decider undoes what they decided) before the stream may no longer
	// be written to. The receiving goroutine ends when the server closes
	// the request body after this returns.
	callsMu.Lock()
	closed = true
	callsMu.Unlock()
	calls.Wait()
	if err == nil {
		sendMu.Lock()
		err = sendErr
		sendMu.Unlock()
	}
	return err
}

// streamCall serves one call of a stream.
func (c *Core) streamCall(ctx context.Context, protocol string, m *cartv1.StreamRequest) *cartv1.StreamResponse {
	resp := &cartv1.StreamResponse{Id: m.GetId()}
	if t := m.GetTimeoutMicros(); t > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(t)*time.Microsecond)
		defer cancel()
	}
	var err error
	switch call := m.GetCall().(type) {
	case *cartv1.StreamRequest_Route:
		var r *cartv1.RouteResponse
		if c.streamTracer != nil && len(m.GetTrace()) > 0 {
			var a any
			a, err = c.streamTracer.StreamCall(ctx, cartv1connect.RouterServiceRouteProcedure, protocol, "", false, m.GetTrace(), call.Route,
				func(ctx context.Context) (any, error) { return c.route(ctx, call.Route) })
			r, _ = a.(*cartv1.RouteResponse)
		} else {
			r, err = c.route(ctx, call.Route)
		}
		if err == nil {
			resp.Result = &cartv1.StreamResponse_Route{Route: r}
		}
	case *cartv1.StreamRequest_Complete:
		resp.Result = &cartv1.StreamResponse_Complete{Complete: c.complete(call.Complete)}
	case *cartv1.StreamRequest_Sync:
		var r *cartv1.SyncResponse
		if r, err = c.sync(call.Sync); err == nil {
			resp.Result = &cartv1.StreamResponse_Sync{Sync: r}
		}
	case nil:
		// (The hello, id 0 with no call, is answered by Stream itself.)
		err = connect.NewError(connect.CodeInvalidArgument, errors.New("stream call with no route, complete or sync"))
	}
	if err != nil {
		resp.Result = &cartv1.StreamResponse_Error{Error: &cartv1.StreamError{Code: uint32(connect.CodeOf(err)), Message: errMessage(err)}}
	}
	return resp
}

func errMessage(err error) string {
	if ce, ok := errors.AsType[*connect.Error](err); ok {
		return ce.Message()
	}
	return err.Error()
}
