package remote

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/cartrouter/cart/controlplane/cpclient"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
	"github.com/cartrouter/cart/internal/coalesce"
)

// The Route stream (Options.RouteStream): one long-lived RouterService.Stream
// call to the leader carries this data plane's Route, Complete and Sync
// calls, matched by id, instead of one HTTP/2 request each. The unary calls
// stay, and every call uses them while no stream is live: before the first
// one opened, while a broken one reconnects, and for good against a control
// plane without the Stream RPC (it is retried with backoff). A stream goes
// live only once the leader answered its hello, so a call never waits for
// a connection to be set up, and a call on a stream that breaks fails at
// once, like a unary call to a node that died, so the caller falls back.

// Calls ready together (a send in progress when they come) share one
// stream message once the leader's hello answer said it reads batches:
// at most streamBatchMax calls, and at most streamBatchBytes encoded
// (unless one call alone is larger), so a batch of long prompts' hashes
// stays well inside the leader's 4 MiB message limit. 64 calls cover a
// busy data plane's concurrency several times over (its in-flight calls
// are bounded by DefaultStreamInFlight anyway).
const (
	streamBatchMax   = 64
	streamBatchBytes = 1 << 20
)

// DefaultStreamInFlight bounds the calls in flight on the stream when
// Options.RouteStreamMaxInFlight is 0.
const DefaultStreamInFlight = 128

// Reconnection backoff of the stream loop.
const (
	streamBackoffMin = 50 * time.Millisecond
	streamBackoffMax = 30 * time.Second
	// streamHelloTimeout bounds the wait for the leader's hello answer.
	streamHelloTimeout = 2 * time.Second
	// streamStable is how long a stream must have lived for the next one
	// to start over from the shortest backoff: a leader that accepts and
	// then drops streams at once must not be redialled in a tight loop.
	streamStable = time.Second
)

// feedQueue bounds the placement-feed frames waiting for the shadow (the
// leader sends at most 512 placements a frame, up to 8 frames every 50 ms).
const feedQueue = 16

// errStreamBroken is what calls in flight on a stream that broke get: the
// Unavailable of a unary call whose node went away.
var errStreamBroken = errors.New("route stream to the control plane broke")

// routeStream is one live stream.
type routeStream struct {
	target string
	conn   *connect.BidiStreamForClient[cartv1.StreamRequest, cartv1.StreamResponse]
	cancel context.CancelFunc
	slots  chan struct{} // flow control: one per call in flight
	opened time.Time

	sendMu sync.Mutex // Send is not safe for concurrent use with CloseRequest
	// out sends the calls, several a message when the leader reads
	// batches (batches), else one each.
	out     *coalesce.Sender[*cartv1.StreamRequest]
	batches bool
	// riders: the leader settles completions that ride with Route calls
	// (its hello answer said so).
	riders bool
	// queues: the leader holds a flow-control queue and answers a queued
	// Route call with an interim answer first (its hello answer said so).
	queues    bool
	flushHook func(calls func() int) // tests only: runs before each message sent, told the Route calls in it and queued behind it

	// feed queues the leader's placement feed for the shadow; nil: not
	// asked for. Frames are applied off the receiving goroutine, so that
	// answers behind a large frame are not held up by the shadow's
	// inserts (~2 µs a placement), and dropped when the queue is full:
	// the shadow is a hint, a Route answer is not.
	feed chan []*cartv1.RecentPlacement

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan *cartv1.StreamResponse
	err     error         // why it broke, once it did
	done    chan struct{} // closed when it broke
}

// fail breaks the stream: every call in flight and every later call on it
// fails with errStreamBroken.
func (s *routeStream) fail(err error) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	s.err = err
	s.pending = nil
	close(s.done)
	s.mu.Unlock()
	// Cancelled before waiting for sendMu: a Send blocked on HTTP/2 flow
	// control (a stalled leader) holds it, and returns only once the
	// request is cancelled.
	s.cancel()
	s.sendMu.Lock()
	abort(s.conn, s.cancel)
	s.sendMu.Unlock()
}

// abort ends a stream so that a Receive blocked on it returns. Cancelling
// its context alone does not: the HTTP/2 transport notices the context
// only once the request body (the send side, open for the stream's whole
// life) is closed.
func abort(conn *connect.BidiStreamForClient[cartv1.StreamRequest, cartv1.StreamResponse], cancel context.CancelFunc) {
	cancel()
	_ = conn.CloseRequest()
}

// cause is why the stream broke (nil while it has not).
func (s *routeStream) cause() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *routeStream) brokenErr() error {
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%w: %v", errStreamBroken, s.cause()))
}

// flush sends a batch of calls as one message: the first, carrying the
// others in more.
func (s *routeStream) flush(b []*cartv1.StreamRequest) error {
	if s.flushHook != nil {
		calls := 0
		for _, m := range b {
			if m.GetRoute() != nil {
				calls++
			}
		}
		s.flushHook(func() int { return calls + s.out.Queued() })
	}
	// A Route whose caller gave up while it waited in the queue is not
	// sent: the leader would decide, and place, for an answer nobody
	// reads. (Reports still go: a late one still settles its tickets.)
	s.mu.Lock()
	kept := b[:0]
	for _, m := range b {
		if _, waited := s.pending[m.GetId()]; waited || m.GetRoute() == nil {
			kept = append(kept, m)
		}
	}
	s.mu.Unlock()
	if b = kept; len(b) == 0 {
		return nil
	}
	first := b[0]
	if len(b) > 1 {
		first.More = b[1:] // the slice is the Sender's: not kept past Send
	}
	s.sendMu.Lock()
	err := s.conn.Send(first)
	s.sendMu.Unlock()
	first.More = nil
	return err
}

// receive delivers answers to their calls until the stream breaks.
func (s *routeStream) receive() {
	for {
		m, err := s.conn.Receive()
		if err != nil {
			s.fail(err)
			return
		}
		more := m.GetMore()
		m.More = nil
		s.deliver(m)
		for _, a := range more {
			s.deliver(a)
		}
	}
}

// deliver hands one answer to its call, or a feed frame to the shadow.
func (s *routeStream) deliver(m *cartv1.StreamResponse) {
	if p := m.GetPlacements(); p != nil && m.GetId() == 0 {
		if s.feed != nil {
			select {
			case s.feed <- p.GetPlacements():
			default:
			}
		}
		return
	}
	s.mu.Lock()
	ch := s.pending[m.GetId()]
	interim := m.GetRoute().GetQueued()
	if !interim {
		delete(s.pending, m.GetId())
	}
	s.mu.Unlock()
	if ch != nil {
		select {
		case ch <- m: // buffered: a caller that gave up does not block this
		default: // a second interim answer: the first one said it all
		}
	}
}

// ctxError is what a unary call returns when ctx ends first.
func ctxError(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
	}
	return connect.NewError(connect.CodeCanceled, ctx.Err())
}

// do sends one call and waits for its answer, within ctx. A call that
// finds every slot taken waits for one (flow control) no longer than ctx
// allows, and then times out as a unary call would.
func (s *routeStream) do(ctx context.Context, req *cartv1.StreamRequest) (*cartv1.StreamResponse, error) {
	m, _, err := s.doQueued(ctx, req, nil)
	return m, err
}

// doQueued is do for a Route call that may wait in the leader's queue: an
// interim queued answer (within ctx) frees the call's slot, and the final
// answer is then awaited within wait instead (nil: no interim answer is
// expected). queued reports that the interim answer came.
func (s *routeStream) doQueued(ctx context.Context, req *cartv1.StreamRequest, wait context.Context) (_ *cartv1.StreamResponse, queued bool, _ error) {
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, false, ctxError(ctx)
	case <-s.done:
		return nil, false, s.brokenErr()
	}
	var freed sync.Once
	free := func() { freed.Do(func() { <-s.slots }) }
	defer free()
	ch := make(chan *cartv1.StreamResponse, 1)
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return nil, false, s.brokenErr()
	}
	s.nextID++
	id := s.nextID
	s.pending[id] = ch
	s.mu.Unlock()
	req.Id = id
	if dl, ok := ctx.Deadline(); ok {
		// The leader undoes a decision that took longer than this, as it
		// does for a unary call's deadline.
		req.TimeoutMicros = uint32(min(max(time.Until(dl).Microseconds(), 1), 1<<32-1))
	}
	// Sent now, or queued behind a send in progress and carried by the
	// next message; a failed send breaks the stream (out's Failed), so
	// this call then ends through done like every other in flight.
	if err := s.out.Send(req); err != nil {
		s.fail(err)
		return nil, false, s.brokenErr()
	}
	for {
		select {
		case m := <-ch:
			if wait != nil && !queued && m.GetRoute().GetQueued() {
				// The leader queued it: the route timeout no longer
				// applies, the queue's deadline does, and the slot goes to
				// calls in flight (as the leader freed its own).
				queued, ctx = true, wait
				free()
				continue
			}
			return m, queued, nil
		case <-ctx.Done():
			s.forget(id)
			return nil, queued, ctxError(ctx)
		case <-s.done:
			select {
			case m := <-ch: // answered just before the break
				if !m.GetRoute().GetQueued() {
					return m, queued, nil
				}
			default:
			}
			return nil, queued, s.brokenErr()
		}
	}
}

func (s *routeStream) forget(id uint64) {
	s.mu.Lock()
	delete(s.pending, id)
	s.mu.Unlock()
}

// streamer owns the data plane's stream: the loop that opens it to the
// current target and the live one, if any.
type streamer struct {
	r           *Router
	maxInFlight int
	kick        chan struct{}          // the target may have changed
	tracer      cpclient.StreamTracer  // traces the Route calls it carries; nil: off
	flushHook   func(calls func() int) // tests only: see routeStream.flushHook
	// retryHook (tests only) is told of each wait before a redial, and
	// whether the control-plane breaker was open then.
	retryHook func(wait time.Duration, breakerOpen bool)
	// noBatch (tests only) makes this data plane neither declare nor send
	// batches, as one that predates them.
	noBatch bool

	// cur is the live stream, if any; read on every call, hence atomic.
	cur atomic.Pointer[routeStream]
	// synced: a unary Sync, or the probe of an open control-plane
	// breaker, was answered since the last failed dial. The dial failed
	// because the node had no leader or was unreachable; now that one
	// answers, retry at once rather than after a backoff that grew during
	// an election or a partition (up to streamBackoffMax).
	synced atomic.Bool

	open      prometheus.GaugeFunc
	fallbacks *prometheus.CounterVec
}

func newStreamer(r *Router, maxInFlight int) *streamer {
	if maxInFlight <= 0 {
		maxInFlight = DefaultStreamInFlight
	}
	s := &streamer{r: r, maxInFlight: maxInFlight, kick: make(chan struct{}, 1), tracer: cpclient.FindStreamTracer(r.o.Interceptors)}
	s.open = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "cart_route_stream_open",
		Help: "1 while this data plane's Route stream to the control-plane leader is live."}, func() float64 {
		if s.live("") != nil {
			return 1
		}
		return 0
	})
	s.fallbacks = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_route_stream_fallbacks_total",
		Help: "Control-plane calls made unary because no Route stream was live (starting, reconnecting, or a control plane without it), by call."}, []string{"call"})
	return s
}

// live returns the live stream to target ("" = any), or nil.
func (s *streamer) live(target string) *routeStream {
	if s == nil {
		return nil
	}
	cur := s.cur.Load()
	if cur == nil || target != "" && cur.target != target {
		return nil
	}
	select {
	case <-cur.done:
		return nil
	default:
		return cur
	}
}

// fed reports whether a live stream carries the leader's placement feed.
func (s *streamer) fed() bool {
	st := s.live("")
	return st != nil && st.feed != nil
}

// unary counts a call that could not use a stream.
func (s *streamer) unary(call string) {
	if s != nil {
		s.fallbacks.WithLabelValues(call).Inc()
	}
}

// answered tells the loop a unary call was answered: a leader is there.
// Only a Sync (once a sync interval) and the probe that closes an open
// breaker (once per recovery) call it, which bounds the redials it causes.
func (s *streamer) answered() {
	if s != nil && s.live("") == nil {
		s.synced.Store(true)
		s.poke()
	}
}

// poke tells the loop the target may have changed.
func (s *streamer) poke() {
	if s == nil {
		return
	}
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// run keeps a stream open to the current target until ctx ends.
func (s *streamer) run(ctx context.Context) {
	backoff := streamBackoffMin
	redirected := false
	for ctx.Err() == nil {
		target := s.r.current()
		if target == "" {
			if !s.wait(ctx, streamBackoffMax) {
				return
			}
			continue
		}
		st, recvDone, err := s.dial(ctx, target)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// A follower names the leader: go there at once, once.
			if url := notLeaderURL(err); url != "" && url != target && !redirected {
				redirected = true
				s.r.follow(url)
				continue
			}
			redirected = false
			wait := s.retryIn(backoff)
			s.r.logRPCError("route stream to the control plane not available; using unary calls", target, err, "retry_in", wait.String())
			// Unreachable, or no answer to the hello (a partition): a
			// leader answering a unary call is reason to retry at once.
			// A node without the RPC is not.
			transient := connect.CodeOf(err) == connect.CodeUnavailable || connect.CodeOf(err) == connect.CodeDeadlineExceeded
			s.synced.Store(false)
			if !s.wait(ctx, wait) {
				return
			}
			if transient && s.synced.Load() {
				backoff = streamBackoffMin
			} else {
				backoff = s.grow(backoff)
			}
			continue
		}
		redirected = false
		s.cur.Store(st)
		// The leader answered the hello: if the breaker is open (the
		// stream came back after a fault), probe it now, on the stream.
		s.r.cpb.probeSoon()
		s.hold(ctx, st)
		s.cur.CompareAndSwap(st, nil)
		st.fail(errors.New("stream closed"))
		<-recvDone
		if time.Since(st.opened) >= streamStable {
			backoff = streamBackoffMin
		}
		if url := notLeaderURL(st.cause()); url != "" && url != target {
			s.r.follow(url) // the leader stepped down and named its successor
			continue
		}
		if ctx.Err() == nil && !s.wait(ctx, s.retryIn(backoff)) {
			return
		}
		backoff = s.grow(backoff)
	}
}

// retryIn is how long to wait before the next dial: backoff, but no more
// than the control-plane breaker's probe interval while it is open. An
// open breaker asks the leader once per cool-off whether it is back, and
// the stream must not lag far behind its answer: over a partition of
// issue 32's length the backoff grew to 12.8, 25.6, then 30 s, and the
// data plane kept every call unary (and its fallbacks) that much longer.
// Trying as often as the probe costs one small call per cool-off.
func (s *streamer) retryIn(backoff time.Duration) time.Duration {
	open := s.r.cpb.isOpen()
	if open {
		backoff = min(backoff, s.r.cpb.probeEvery())
	}
	if s.retryHook != nil {
		s.retryHook(backoff, open)
	}
	return backoff
}

// grow doubles backoff, up to the breaker's probe interval while it is
// open (so that the wait after it closes starts from there, not from a
// backoff grown during the fault), else to streamBackoffMax.
func (s *streamer) grow(backoff time.Duration) time.Duration {
	limit := streamBackoffMax
	if s.r.cpb.isOpen() {
		limit = s.r.cpb.probeEvery()
	}
	return min(2*backoff, limit)
}

// hold returns when st breaks, the target changes or ctx ends.
func (s *streamer) hold(ctx context.Context, st *routeStream) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-st.done:
			return
		case <-s.kick:
			if s.r.current() != st.target {
				return
			}
		}
	}
}

// wait sleeps d, or less when poked; false when ctx ended.
func (s *streamer) wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	case <-s.kick:
	}
	return true
}

// dial opens a stream to target and waits for the leader's hello answer.
// recvDone is closed when the stream's receiver has returned.
func (s *streamer) dial(ctx context.Context, target string) (*routeStream, chan struct{}, error) {
	sctx, cancel := context.WithCancel(ctx)
	conn := s.r.client(target).Stream(sctx)
	var feed *cartv1.PlacementFeed
	var fed func([]*cartv1.RecentPlacement)
	if s.r.o.PlacementFeed && s.r.shadow != nil {
		feed, fed = &cartv1.PlacementFeed{}, s.r.applyFeed
	}
	hello := make(chan error, 1)
	// acked: the leader answered the hello with an (empty) placements
	// frame, which says it will feed; a leader that predates the feed
	// ignores the request, and this data plane then records its own
	// answers as before. batches: the leader reads batched calls (one
	// that predates them leaves it unset, and gets one call a message).
	// riders: the leader settles completions riding with Route calls.
	// early: what the leader batched with its answer (not sent by this
	// leader, but allowed). Read after hello delivers.
	acked, batches, riders, queues := false, false, false, false
	var early []*cartv1.StreamResponse
	go func() {
		if err := conn.Send(&cartv1.StreamRequest{PlacementFeed: feed, Batches: !s.noBatch}); err != nil && !errors.Is(err, io.EOF) {
			hello <- err
			return
		}
		m, err := conn.Receive()
		switch {
		case err != nil:
			hello <- err
		case m.GetId() != 0 || m.GetResult() != nil && (feed == nil || m.GetPlacements() == nil):
			hello <- fmt.Errorf("unexpected answer to the stream hello: id %d", m.GetId())
		default:
			acked, batches, riders, early = m.GetPlacements() != nil, m.GetBatches(), m.GetSettlesRiders(), m.GetMore()
			queues = m.GetQueues()
			hello <- nil
		}
	}()
	t := time.NewTimer(streamHelloTimeout)
	defer t.Stop()
	var err error
	select {
	case err = <-hello:
	case <-t.C:
		abort(conn, cancel)
		<-hello
		// A leader answers a hello in a round trip; two seconds of
		// silence is a dead connection (or a dead leader), and the next
		// dial must not be made on it again.
		s.r.dropConns(target, "stream_hello")
		return nil, nil, connect.NewError(connect.CodeDeadlineExceeded, errors.New("no answer to the route stream hello"))
	}
	if err != nil {
		abort(conn, cancel)
		_ = conn.CloseResponse()
		return nil, nil, err
	}
	st := &routeStream{target: target, conn: conn, cancel: cancel, slots: make(chan struct{}, s.maxInFlight),
		opened: time.Now(), pending: map[uint64]chan *cartv1.StreamResponse{}, done: make(chan struct{}),
		batches: batches && !s.noBatch, riders: riders, queues: queues, flushHook: s.flushHook}
	// The queue holds no more calls than may be in flight: a caller that
	// gave up (and freed its slot) while its call still waited here does
	// not let another queue beyond the bound.
	o := coalesce.Options[*cartv1.StreamRequest]{Failed: st.fail, Queue: s.maxInFlight}
	if st.batches {
		o.Max, o.MaxCost = streamBatchMax, streamBatchBytes
		o.Cost = func(m *cartv1.StreamRequest) int { return proto.Size(m) }
	}
	st.out = coalesce.New(st.flush, o)
	var applied chan struct{}
	if fed != nil && acked {
		st.feed, applied = make(chan []*cartv1.RecentPlacement, feedQueue), make(chan struct{})
		go func() {
			defer close(applied)
			for p := range st.feed {
				fed(p)
			}
		}()
	}
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		for _, m := range early {
			st.deliver(m)
		}
		st.receive()
		_ = conn.CloseResponse()
		if st.feed != nil {
			close(st.feed)
			<-applied
		}
	}()
	return st, recvDone, nil
}

// answer unpacks a stream answer into the unary call's result or error.
func answer[T any](m *cartv1.StreamResponse, get func(*cartv1.StreamResponse) *T) (*T, error) {
	if e := m.GetError(); e != nil {
		ce := connect.NewError(connect.Code(e.GetCode()), errors.New(e.GetMessage()))
		for _, a := range e.GetDetails() {
			if d, err := connect.NewErrorDetail(a); err == nil {
				ce.AddDetail(d)
			}
		}
		return nil, ce
	}
	if v := get(m); v != nil {
		return v, nil
	}
	return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("stream answer %d of the wrong kind", m.GetId()))
}

// askLeader is Route on st, the stream to target the caller found live
// (it may have ended since: the call then fails), or unary when st is nil.
// A call given wait may wait in the leader's queue (see doQueued); wait is
// nil for one that may not, and for a unary call.
func (r *Router) askLeader(ctx, wait context.Context, target string, st *routeStream, m *cartv1.RouteRequest) (_ *cartv1.RouteResponse, queued bool, _ error) {
	if st != nil {
		req := &cartv1.StreamRequest{Call: &cartv1.StreamRequest_Route{Route: m}}
		do := func(ctx context.Context) (any, error) {
			a, q, err := st.doQueued(ctx, req, wait)
			queued = q
			if err != nil {
				return nil, err
			}
			return answer(a, (*cartv1.StreamResponse).GetRoute)
		}
		var resp any
		var err error
		if r.streams.tracer == nil {
			resp, err = do(ctx)
		} else {
			req.Trace = map[string]string{}
			resp, err = r.streams.tracer.StreamCall(ctx, cartv1connect.RouterServiceRouteProcedure, st.conn.Peer().Protocol, st.conn.Peer().Addr, true, req.Trace, m, do)
		}
		if err != nil {
			return nil, queued, err
		}
		rr, _ := resp.(*cartv1.RouteResponse)
		return rr, queued, nil
	}
	r.streams.unary("route")
	resp, err := r.client(target).Route(ctx, connect.NewRequest(m))
	if err != nil {
		return nil, false, err
	}
	return resp.Msg, false, nil
}

// completeCall is Complete on the live stream to target, or unary.
func (r *Router) completeCall(ctx context.Context, target string, m *cartv1.CompleteRequest) (*cartv1.CompleteResponse, error) {
	return reportCall(ctx, r, target, "complete", &cartv1.StreamRequest{Call: &cartv1.StreamRequest_Complete{Complete: m}},
		(*cartv1.StreamResponse).GetComplete, func(c cartv1connect.RouterServiceClient) (*connect.Response[cartv1.CompleteResponse], error) {
			return c.Complete(ctx, connect.NewRequest(m))
		})
}

// syncCall is Sync on the live stream to target, or unary.
func (r *Router) syncCall(ctx context.Context, target string, m *cartv1.SyncRequest) (*cartv1.SyncResponse, error) {
	return reportCall(ctx, r, target, "sync", &cartv1.StreamRequest{Call: &cartv1.StreamRequest_Sync{Sync: m}},
		(*cartv1.StreamResponse).GetSync, func(c cartv1connect.RouterServiceClient) (*connect.Response[cartv1.SyncResponse], error) {
			resp, err := c.Sync(ctx, connect.NewRequest(m))
			if err == nil {
				r.streams.answered()
			}
			return resp, err
		})
}

// reportCall sends a report (Complete or Sync) on the live stream to
// target, or unary as name when there is none or it broke under the call.
func reportCall[T any](ctx context.Context, r *Router, target, name string, req *cartv1.StreamRequest,
	get func(*cartv1.StreamResponse) *T, unary func(cartv1connect.RouterServiceClient) (*connect.Response[T], error)) (*T, error) {
	if st := r.streams.live(target); st != nil {
		a, err := st.do(ctx, req)
		if err == nil {
			return answer(a, get)
		}
		if !errors.Is(err, errStreamBroken) {
			return nil, err
		}
		// Unlike a route, whose caller falls back to local routing at
		// once, a report is worth its unary retry: it is idempotent (a
		// ticket settles once, sync counts are absolute), and a lost one
		// leaves load on the leader until the next one.
	}
	r.streams.unary(name)
	resp, err := unary(r.client(target))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// Collectors are the router's metrics (the Route stream's only when it is
// on), for the data plane's /metrics.
func (r *Router) Collectors() []prometheus.Collector {
	if r.streams == nil {
		return []prometheus.Collector{r.redials}
	}
	return []prometheus.Collector{r.redials, r.streams.open, r.streams.fallbacks}
}
