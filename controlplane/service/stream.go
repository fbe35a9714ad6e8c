package service

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
	"github.com/cartrouter/cart/internal/coalesce"
)

// maxStreamInFlight bounds the calls one stream has in progress on the
// leader. Past it the leader stops reading the stream, and HTTP/2 flow
// control pushes back on the data plane, which bounds its own in-flight
// calls below this anyway.
const maxStreamInFlight = 256

// streamBatchMax bounds the answers (and feed frames) in one message to
// a data plane that reads batches. Under load a batch is about as large
// as the number of calls that finish during one send; 64 covers the
// concurrency of a busy data plane several times over while keeping a
// message of route answers (~100-200 bytes each) near one 16 KiB HTTP/2
// frame, so the first answer in it is not held up behind the encoding of
// hundreds. Feed frames (up to 512 placements each) make a message
// larger, hence streamBatchBytes.
const streamBatchMax = 64

// streamBatchBytes bounds the encoded size of one message of batched
// answers (an answer larger alone still goes, alone). The data plane's
// client (dataplane/remote newClient) reads a message of up to
// cpclient.MaxAnswerBytes and ends the stream on a larger one; the
// bound is well below that, and is for the stream: an unbounded batch of
// feed frames and Sync answers is one long message that the data plane
// must read whole before it sees the first answer in it. 1
// MiB, like the data plane's request batches, also stays well below the
// 4 MiB (cpclient.MaxMessageBytes) the leader itself reads.
const streamBatchBytes = 1 << 20

// streamAnswerCost is what answer m adds to a message as an element of
// StreamResponse.more: its encoding, field tag and length. (The first
// answer of a message has no tag and length, so a message's sum
// overstates it by a few bytes.)
func streamAnswerCost(m *cartv1.StreamResponse) int {
	return protowire.SizeTag(streamMoreField) + protowire.SizeBytes(proto.Size(m))
}

var streamMoreField = (&cartv1.StreamResponse{}).ProtoReflect().Descriptor().Fields().ByName("more").Number()

// streamScope tracks what ends every open stream: this node's current
// term as leader, and the API server's shutdown (a stream never ends on
// its own, so a graceful shutdown would wait for it until its deadline).
type streamScope struct {
	mu       sync.Mutex
	lead     chan struct{} // closed when the current leadership ends; nil when not leading
	shut     chan struct{}
	shutOnce sync.Once
	// flushHook, set by tests only, runs before each message a stream
	// sends, with the number of answers then queued behind it.
	flushHook func(queued func() int)
	// batchBytes, set by tests only, replaces streamBatchBytes when > 0.
	batchBytes int
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
// maxStreamInFlight, counted per call, however they were batched) and are
// answered as they finish, so a slow one does not hold up the others.
// Answers that are ready together share a message when the data plane's
// hello said it reads StreamResponse.more.
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
		callsMu sync.Mutex
		closed  bool // no call may start: the handler is returning
		calls   sync.WaitGroup
		out     *coalesce.Sender[*cartv1.StreamResponse]
	)
	hook := c.streams.flushHook
	batchBytes := streamBatchBytes
	if c.streams.batchBytes > 0 {
		batchBytes = c.streams.batchBytes
	}
	// One answer a message (Max 1) until the hello says the data plane
	// reads batches.
	msgsIn, itemsIn := c.metrics.streamMessages.WithLabelValues("received"), c.metrics.streamItems.WithLabelValues("received")
	msgsOut, itemsOut := c.metrics.streamMessages.WithLabelValues("sent"), c.metrics.streamItems.WithLabelValues("sent")
	out = coalesce.New(func(b []*cartv1.StreamResponse) error {
		if hook != nil {
			hook(out.Queued)
		}
		msgsOut.Inc()
		itemsOut.Add(float64(len(b)))
		first := b[0]
		if len(b) > 1 {
			first.More = b[1:]
		}
		err := st.Send(first)
		first.More = nil
		return err
	}, coalesce.Options[*cartv1.StreamResponse]{Queue: maxStreamInFlight, Cost: streamAnswerCost, MaxCost: batchBytes, Failed: func(error) {
		cancel() // the data plane is gone: stop reading too
	}})
	send := func(r *cartv1.StreamResponse) {
		_ = out.Send(r) // a failure ends the stream through Failed
	}
	// sendFrame sends a placement-feed frame, whose size the feed knew
	// when it recorded the placements.
	sendFrame := func(r *cartv1.StreamResponse, placementBytes int) {
		_ = out.SendCost(r, placementBytes+feedFrameOverhead)
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
	// start serves m in a goroutine of its own once a slot is free, or
	// answers it with INVALID_ARGUMENT and why when invalid is not empty.
	start := func(m *cartv1.StreamRequest, invalid string) error {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		if !begin() {
			return context.Canceled
		}
		go func() {
			defer calls.Done()
			var freed sync.Once
			free := func() { freed.Do(func() { <-slots }) }
			defer free()
			if invalid != "" {
				send(streamErrorAnswer(m.GetId(), connect.NewError(connect.CodeInvalidArgument, errors.New(invalid))))
				return
			}
			// A call waiting in the flow-control queue gives its slot
			// back: a fleet-wide queue deeper than maxStreamInFlight must
			// not stop the stream from carrying the completions that free
			// room for it.
			queued := func() {
				send(&cartv1.StreamResponse{Id: m.GetId(), Result: &cartv1.StreamResponse_Route{Route: &cartv1.RouteResponse{Queued: true}}})
				free()
			}
			send(c.streamCall(ctx, st.Peer().Protocol, m, queued))
		}()
		return nil
	}
	recvDone := make(chan error, 1)
	go func() {
		feeding := false
		for {
			m, err := st.Receive()
			if err != nil {
				recvDone <- err
				return
			}
			more := m.GetMore()
			m.More = nil
			msgsIn.Inc()
			itemsIn.Add(float64(1 + len(more)))
			if m.GetId() == 0 && m.GetCall() == nil {
				// The hello, answered here so that nothing the feed sends
				// can come before its answer. It counts as a call, so the
				// handler does not return while it sends.
				if !begin() {
					recvDone <- context.Canceled
					return
				}
				if m.GetBatches() {
					out.SetMax(streamBatchMax)
				}
				if m.GetPlacementFeed() != nil {
					// An empty frame acknowledges the feed: a data plane
					// whose leader predates it keeps recording its own
					// answers.
					send(&cartv1.StreamResponse{Batches: true, SettlesRiders: true, Queues: true, Result: &cartv1.StreamResponse_Placements{Placements: &cartv1.RecentPlacements{}}})
				} else {
					send(&cartv1.StreamResponse{Batches: true, SettlesRiders: true, Queues: true})
				}
				if m.GetPlacementFeed() != nil && !feeding {
					feeding = true
					calls.Add(1) // while the hello's count is held: Wait has not returned
					go func() {
						defer calls.Done()
						c.feed(ctx, sendFrame)
					}()
				}
				calls.Done()
				for _, x := range more {
					if err := start(x, "the stream hello carries no batched calls"); err != nil {
						recvDone <- err
						return
					}
				}
				continue
			}
			if err := start(m, ""); err != nil {
				recvDone <- err
				return
			}
			for _, x := range more {
				if err := start(x, invalidBatched(x)); err != nil {
					recvDone <- err
					return
				}
			}
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
	// decider undoes what they decided), and the answers they queued are
	// sent, before the stream may no longer be written to. The receiving
	// goroutine ends when the server closes the request body after this
	// returns.
	callsMu.Lock()
	closed = true
	callsMu.Unlock()
	calls.Wait()
	if sendErr := out.Close(); err == nil {
		err = sendErr
	}
	return err
}

// invalidBatched says why x cannot be a call batched in
// StreamRequest.more, or "" when it can.
func invalidBatched(x *cartv1.StreamRequest) string {
	switch {
	case x.GetId() == 0:
		return "a batched stream call needs a nonzero id (the hello cannot be batched)"
	case len(x.GetMore()) > 0:
		return "a batched stream call cannot carry more calls of its own"
	case x.GetPlacementFeed() != nil || x.GetBatches():
		return "placement_feed and batches belong to the stream hello only"
	}
	return ""
}

// streamErrorAnswer is the answer to call id that failed with err, with
// the details the unary call's error would carry.
func streamErrorAnswer(id uint64, err error) *cartv1.StreamResponse {
	se := &cartv1.StreamError{Code: uint32(connect.CodeOf(err)), Message: errMessage(err)}
	if ce, ok := errors.AsType[*connect.Error](err); ok {
		for _, d := range ce.Details() {
			se.Details = append(se.Details, &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()})
		}
	}
	return &cartv1.StreamResponse{Id: id, Result: &cartv1.StreamResponse_Error{Error: se}}
}

// streamCall serves one call of a stream. queued, when set, is called
// (once) if a Route call starts waiting in the flow-control queue: the
// stream sends the interim answer and frees the call's slot.
func (c *Core) streamCall(ctx context.Context, protocol string, m *cartv1.StreamRequest, queued func()) *cartv1.StreamResponse {
	resp := &cartv1.StreamResponse{Id: m.GetId()}
	// Only a Route uses the call's timeout: it is a deadline the decision
	// is checked against (an answer past it is undone), not a context with
	// a timer of its own.
	var expired func() bool
	if t := m.GetTimeoutMicros(); t > 0 {
		deadline := c.o.Now().Add(time.Duration(t) * time.Microsecond)
		expired = func() bool { return c.o.Now().After(deadline) }
	}
	var err error
	switch call := m.GetCall().(type) {
	case *cartv1.StreamRequest_Route:
		var r *cartv1.RouteResponse
		if c.streamTracer != nil && len(m.GetTrace()) > 0 {
			var a any
			a, err = c.streamTracer.StreamCall(ctx, cartv1connect.RouterServiceRouteProcedure, protocol, "", false, m.GetTrace(), call.Route,
				func(ctx context.Context) (any, error) { return c.decide(ctx, call.Route, expired, queued) })
			r, _ = a.(*cartv1.RouteResponse)
		} else {
			r, err = c.decide(ctx, call.Route, expired, queued)
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
		return streamErrorAnswer(m.GetId(), err)
	}
	return resp
}

func errMessage(err error) string {
	if ce, ok := errors.AsType[*connect.Error](err); ok {
		return ce.Message()
	}
	return err.Error()
}
