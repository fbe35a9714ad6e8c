package epp

import (
	"context"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/cartrouter/cart/dataplane/proxy"
)

type pickResult struct{ pk *proxy.Pick }

// stream is one HTTP request's ext_proc exchange. Its fields belong to
// Process's goroutine, except those under mu (the handler's goroutine
// reads the subset and records the worker snapshot).
type stream struct {
	s   *Server
	srv extprocv3.ExternalProcessor_ProcessServer
	ctx context.Context

	seen    bool     // a first message arrived
	in      *inbound // the request headers, once they arrived
	feed    *feed    // the request body; nil for a request without one
	rec     recorder
	handled chan struct{} // closed when the handler returns; nil once acted on
	running chan struct{} // the same, kept for end
	picked  chan pickResult
	pick    *proxy.Pick

	mu        sync.Mutex
	subset    []string
	hasSubset bool
	pool      *pool // the workers when the decision was made

	reqDone     bool // the request body is complete (end_of_stream or trailers)
	trailers    bool // the request has trailers, to answer after the body
	answered    bool // the headers and body responses went out
	respStarted bool
	respDone    bool
	servedSeen  bool // the gateway's served report was acted on
	gone        bool // the stream broke off rather than ending
}

func (st *stream) send(r *extprocv3.ProcessingResponse) error {
	if err := st.srv.Send(r); err != nil {
		st.gone = true
		return err
	}
	return nil
}

// message handles one message in the order Envoy sends them: request
// headers, body chunks, trailers; then response headers, body, trailers.
func (st *stream) message(req *extprocv3.ProcessingRequest) error {
	if !st.seen {
		st.seen = true
		if err := checkMode(req.GetProtocolConfig(), req.GetObservabilityMode()); err != nil {
			return err
		}
	}
	md := req.GetMetadataContext()
	if sub, ok := subsetHint(md); ok {
		st.mu.Lock()
		st.subset, st.hasSubset = sub, true
		st.mu.Unlock()
	}
	switch v := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return st.requestHeaders(v.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return st.requestBody(v.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return st.requestTrailers()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return st.responseHeaders(v.ResponseHeaders, served(md))
	case *extprocv3.ProcessingRequest_ResponseBody:
		return st.responseBody(v.ResponseBody, served(md))
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return st.responseTrailers(served(md))
	}
	return errf("message without a request, headers, body or trailers")
}

// requestHeaders starts the proxy's handler on the request. Its body, if
// any, follows through the feed as the gateway streams it.
func (st *stream) requestHeaders(h *extprocv3.HttpHeaders) error {
	if st.in != nil {
		return errf("request headers arrived twice")
	}
	in, err := parseHeaders(h.GetHeaders())
	if err != nil {
		return err
	}
	u, err := in.url()
	if err != nil {
		return err
	}
	st.in = in
	r := &http.Request{Method: in.method, URL: u, RequestURI: in.path, Proto: "HTTP/2.0", ProtoMajor: 2,
		Header: in.header, Host: in.authority, ContentLength: in.contentLength}
	if h.GetEndOfStream() {
		r.Body, r.ContentLength, st.reqDone = http.NoBody, 0, true
	} else {
		st.feed = newFeed(st.s.o.MaxBodyBytes)
		r.Body, st.rec.feed = st.feed, st.feed
	}
	r = r.WithContext(proxy.WithPicker(st.ctx, proxy.PickOptions{
		Exclude: st.exclude,
		Picked: func(pk *proxy.Pick) {
			if st.feed != nil {
				st.feed.Close() // the pick carries the body the handler read
			}
			st.picked <- pickResult{pk}
		},
	}))
	st.handled = make(chan struct{})
	st.running = st.handled
	go func() {
		defer close(st.running)
		if st.feed != nil {
			defer st.feed.Close()
		}
		st.s.o.Handler.ServeHTTP(&st.rec, r)
	}()
	return nil
}

// exclude runs on the handler's goroutine when it routes: the workers
// outside the gateway's subset, or without an endpoint.
func (st *stream) exclude() []string {
	p := newPool(st.s.o.Workers())
	st.mu.Lock()
	st.pool = p
	sub, has := st.subset, st.hasSubset
	st.mu.Unlock()
	if !has {
		sub = nil
	}
	return p.excluded(sub)
}

func (st *stream) requestBody(b *extprocv3.HttpBody) error {
	if st.in == nil || st.reqDone {
		return errf("request body outside a request (before its headers, or after its end)")
	}
	if st.feed.write(st.ctx, b.GetBody()) != nil {
		return nil // the stream is gone: the loop sees its context end
	}
	if b.GetEndOfStream() {
		st.feed.close()
		st.reqDone = true
		return st.answer()
	}
	return nil
}

func (st *stream) requestTrailers() error {
	if st.in == nil || st.reqDone {
		return errf("request trailers outside a request with a body")
	}
	st.trailers, st.reqDone = true, true
	st.feed.close()
	return st.answer()
}

func (st *stream) onPick(pr pickResult) error {
	st.pick = pr.pk
	return st.answer()
}

// answer sends the decision once it is made and the request body is
// complete: the headers response (destination header and metadata, the
// route cache cleared), then the body the worker must get in chunks,
// then the trailers' response.
func (st *stream) answer() error {
	pk := st.pick
	if pk == nil || !st.reqDone || st.answered {
		return nil
	}
	o := &st.s.o
	st.mu.Lock()
	p := st.pool // set by exclude, which the proxy calls before it picks
	st.mu.Unlock()
	var fb []string
	if !pk.Pinned {
		fb = p.fallbacks(choice{Primary: pk.Worker, Candidate: pk.Candidate, Exclude: pk.Exclude, Avoid: pk.Avoid, N: o.Fallbacks,
			SameKey: func(w string) bool { return o.WorkerKey == nil || o.WorkerKey(w) == pk.WorkerKey }}, rand.Shuffle)
	}
	dest, ok := p.answer(pk.Worker, fb)
	if !ok {
		// A worker the router knows by a host name only: no gateway can
		// dial it as an endpoint.
		pk.Refuse(http.StatusServiceUnavailable)
		o.Metrics.Immediate.WithLabelValues("503").Inc()
		st.answered = true
		return st.send(immediate(http.StatusServiceUnavailable, http.Header{"Content-Type": {"application/json"}, "Retry-After": {"1"}},
			[]byte(`{"error":{"message":"the chosen worker has no IP address a gateway can dial","type":"service_unavailable","code":"no_endpoint"}}`)))
	}
	hm := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
		set(HeaderDestination, dest),
		set("x-request-id", pk.ID),
	}}
	if st.feed != nil {
		hm.SetHeaders = append(hm.SetHeaders, set("content-length", strconv.Itoa(len(pk.Body))))
	}
	// The client's credentials are never forwarded; the worker's own key,
	// if it has one, replaces them.
	if pk.WorkerKey != "" {
		hm.SetHeaders = append(hm.SetHeaders, set("authorization", "Bearer "+pk.WorkerKey))
		hm.RemoveHeaders = []string{"x-api-key"}
	} else {
		hm.RemoveHeaders = []string{"authorization", "x-api-key"}
	}
	st.answered = true
	o.Metrics.Answers.WithLabelValues(strconv.Itoa(len(fb))).Inc()
	if err := st.send(&extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{HeaderMutation: hm, ClearRouteCache: true},
		}},
		DynamicMetadata: destinationMetadata(dest),
	}); err != nil {
		return err
	}
	if st.feed != nil {
		for _, c := range bodyChunks(pk.Body, !st.trailers) {
			if err := st.send(requestBody(c)); err != nil {
				return err
			}
		}
	}
	if st.trailers {
		if err := st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}); err != nil {
			return err
		}
	}
	pk.Dispatched()
	return nil
}

// servedBy passes the gateway's report of the endpoint that served the
// request.
func (st *stream) servedBy(addr string) {
	if addr == "" || st.pick == nil || st.servedSeen {
		return
	}
	st.servedSeen = true
	st.mu.Lock()
	p := st.pool
	st.mu.Unlock()
	if w := p.worker(addr); w != st.pick.Worker {
		st.s.o.Metrics.ServedElsewhere.Inc()
		st.pick.ServedBy(w)
	}
}

func (st *stream) responseHeaders(h *extprocv3.HttpHeaders, servedAddr string) error {
	if !st.answered || st.pick == nil || st.respStarted {
		return errf("response headers before the request was answered, or twice")
	}
	st.respStarted = true
	st.servedBy(servedAddr)
	code := 0
	for _, hv := range h.GetHeaders().GetHeaders() {
		if hv.GetKey() == ":status" {
			code, _ = strconv.Atoi(headerValue(hv))
		}
	}
	if code < 100 || code > 599 {
		return errf("response headers without a valid :status")
	}
	st.pick.Response(code)
	hm := &extprocv3.HeaderMutation{}
	if st.pick.RoutedPeerHeader {
		hm.SetHeaders = []*corev3.HeaderValueOption{set("x-routed-peer", st.pick.Worker)}
	} else {
		// CART's own header: a worker must not make it up either.
		hm.RemoveHeaders = []string{"x-routed-peer"}
	}
	if h.GetEndOfStream() {
		st.respDone = true
		st.pick.Finish(false) // before the answer goes on, as for a body's end
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
		Response: &extprocv3.CommonResponse{HeaderMutation: hm},
	}}})
}

// responseBody passes each chunk of the answer back as it came (the
// stream's tokens must not wait), reading the usage report on the way.
func (st *stream) responseBody(b *extprocv3.HttpBody, servedAddr string) error {
	if !st.respStarted || st.respDone {
		return errf("response body outside a response")
	}
	st.servedBy(servedAddr)
	st.pick.ResponseBody(b.GetBody())
	if b.GetEndOfStream() {
		// Settled before the last bytes go back: the worker is done, and
		// a client that sends its next request as soon as it has them
		// must find the load released (as the proxy settles at the
		// worker's end of stream).
		st.respDone = true
		st.pick.Finish(false)
	}
	for _, c := range bodyChunks(b.GetBody(), b.GetEndOfStream()) {
		if err := st.send(responseBody(c)); err != nil {
			return err
		}
	}
	return nil
}

func (st *stream) responseTrailers(servedAddr string) error {
	if !st.respStarted || st.respDone {
		return errf("response trailers outside a response")
	}
	st.servedBy(servedAddr)
	st.respDone = true
	st.pick.Finish(false)
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}})
}

// sendImmediate relays what the handler answered itself.
func (st *stream) sendImmediate() error {
	if st.rec.status == 0 {
		return nil // the client left before anything was answered
	}
	st.s.o.Metrics.Immediate.WithLabelValues(strconv.Itoa(st.rec.status)).Inc()
	return st.send(immediate(st.rec.status, st.rec.header, st.rec.body.Bytes()))
}

// end releases what the stream holds when it ends, however it ends: the
// body no longer arrives, the decision is settled (a stream that broke
// off is a client that hung up) and the handler returns.
func (st *stream) end() {
	if st.feed != nil {
		st.feed.abort(context.Canceled)
	}
	if st.pick != nil {
		st.pick.Finish(st.gone)
	}
	if st.running != nil {
		<-st.running
	}
}
