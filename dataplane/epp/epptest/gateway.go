package epptest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
)

// Exchange is what the gateway saw of one request's stream, for tests.
type Exchange struct {
	// Immediate is the status of an ImmediateResponse (0: none).
	Immediate int
	// Destination is the answer (header value) and Metadata the dynamic
	// metadata's value; ClearRouteCache the headers response's flag.
	Destination, Metadata string
	ClearRouteCache       bool
	// BodyChunks are the sizes of the request body chunks the picker sent.
	BodyChunks []int
	// Served is the endpoint that served the request ("" none answered).
	Served string
	// Status is the worker's status as relayed (0 before a response).
	Status int
	// Err is what went wrong on the gateway's side, if anything.
	Err error

	answered func() // the response is complete: the client may go
}

// Gateway forwards HTTP requests to the endpoints a picker names: the
// Envoy side of the Endpoint Picker Protocol, as an http.Handler.
type Gateway struct {
	// Conn is the picker; Conns, when set, are several replicas of it,
	// each request's stream going to the next (round robin, as an Envoy
	// cluster of picker endpoints balances streams).
	Conn  *grpc.ClientConn
	Conns []*grpc.ClientConn
	// ChunkSize is the size of the request and response body chunks sent
	// to the picker (Envoy's are its buffer's, often 16 KiB); 0: 16 KiB.
	ChunkSize int
	// Subset, when set, gives the subset hint of a request (nil: none).
	Subset func(*http.Request) []string
	// NoServedReport leaves out the served endpoint in the response phase.
	NoServedReport bool
	// Transport carries the requests to workers (nil: a fresh one).
	Transport http.RoundTripper
	// Observe, when set, gets every exchange when it ends.
	Observe func(Exchange)
	// Static, when set, is an endpoint ("ip:port") every request goes to
	// without asking any picker: the gateway's own cost, to subtract from
	// a picker's in a benchmark.
	Static string

	once sync.Once
	rt   http.RoundTripper
	next atomic.Uint64
}

func (g *Gateway) conn() *grpc.ClientConn {
	if len(g.Conns) == 0 {
		return g.Conn
	}
	return g.Conns[(g.next.Add(1)-1)%uint64(len(g.Conns))]
}

func (g *Gateway) transport() http.RoundTripper {
	g.once.Do(func() {
		g.rt = g.Transport
		if g.rt == nil {
			d := &net.Dialer{Timeout: 2 * time.Second}
			g.rt = &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 256, DisableCompression: true}
		}
	})
	return g.rt
}

func (g *Gateway) chunk() int {
	if g.ChunkSize > 0 {
		return g.ChunkSize
	}
	return 16 << 10
}

// hopByHop are not sent to the picker nor forwarded (Envoy drops them
// from HTTP/1 requests).
var hopByHop = map[string]bool{"Connection": true, "Keep-Alive": true, "Te": true, "Transfer-Encoding": true, "Upgrade": true, "Proxy-Connection": true}

// ServeHTTP runs one request through the picker and a worker.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if g.Static != "" {
		g.serveStatic(w, r)
		return
	}
	var ex Exchange
	defer func() {
		if g.Observe != nil {
			g.Observe(ex)
		}
	}()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	// The stream outlives the client by a little: once the answer is
	// complete, a client that hangs up does not reset it (Envoy closes a
	// finished stream normally); before, it does.
	s, err := Open(context.WithoutCancel(ctx), g.conn())
	if err != nil {
		ex.Err = err
		http.Error(w, "ext_proc: "+err.Error(), http.StatusInternalServerError)
		return
	}
	defer s.Reset()
	answered := make(chan struct{})
	var answeredOnce sync.Once
	ex.answered = func() { answeredOnce.Do(func() { close(answered) }) }
	defer ex.answered()
	go func() {
		select {
		case <-ctx.Done():
			select {
			case <-answered:
			default:
				s.Reset()
			}
		case <-answered:
		}
	}()
	h := http.Header{}
	for k, vv := range r.Header {
		if !hopByHop[k] {
			h[k] = vv
		}
	}
	hasBody := r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody
	first := RequestHeaders(r.Method, r.URL.RequestURI(), r.Host, h, !hasBody)
	if g.Subset != nil {
		if sub := g.Subset(r); sub != nil {
			first.MetadataContext = Subset(sub...)
		}
	}
	if err := s.Send(first); err != nil {
		ex.Err = err
		http.Error(w, "ext_proc: "+err.Error(), http.StatusInternalServerError)
		return
	}
	// The body goes out as it arrives, without waiting for answers.
	sendErr := make(chan error, 1)
	if hasBody {
		go func() { sendErr <- g.sendBody(s, r.Body, r.ContentLength) }()
	} else {
		sendErr <- nil
	}
	mut, body, ok := g.requestPhase(s, w, hasBody, &ex)
	if err := <-sendErr; err != nil && ok {
		ex.Err = err
		http.Error(w, "request body: "+err.Error(), http.StatusBadRequest)
		return
	}
	if !ok {
		s.Reset()
		<-sendErr
		return
	}
	ApplyMutation(h, mut)
	g.forward(ctx, s, w, r, h, body, &ex)
}

func (g *Gateway) sendBody(s *Stream, rb io.Reader, length int64) error {
	buf := make([]byte, g.chunk())
	left := length
	for {
		n, err := io.ReadFull(rb, buf)
		eof := err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF)
		if err != nil && !eof {
			return err
		}
		// A body of known length ends with its last bytes, as HTTP/2's
		// end_stream comes with the last DATA frame.
		if left -= int64(n); left == 0 {
			eof = true
		}
		if n > 0 || eof {
			if serr := s.Send(RequestBody(append([]byte(nil), buf[:n]...), eof)); serr != nil {
				return serr
			}
		}
		if eof {
			return nil
		}
	}
}

// requestPhase reads the picker's answer: the headers response's
// mutation, then the body the worker is to get. It answers the client
// itself on an ImmediateResponse or a protocol violation (ok false).
func (g *Gateway) requestPhase(s *Stream, w http.ResponseWriter, hasBody bool, ex *Exchange) (mut *extprocv3.HeaderMutation, body []byte, ok bool) {
	for {
		m, err := s.Recv()
		if err != nil {
			ex.Err = err
			http.Error(w, "ext_proc: "+err.Error(), http.StatusInternalServerError)
			return nil, nil, false
		}
		switch v := m.GetResponse().(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			ir := v.ImmediateResponse
			ex.Immediate = int(ir.GetStatus().GetCode())
			ApplyMutation(w.Header(), ir.GetHeaders())
			w.WriteHeader(ex.Immediate)
			_, _ = w.Write(ir.GetBody())
			return nil, nil, false
		case *extprocv3.ProcessingResponse_RequestHeaders:
			if mut != nil {
				return nil, nil, g.violation(w, ex, "request headers answered twice")
			}
			ex.Destination, ex.Metadata = Destination(m)
			ex.ClearRouteCache = v.RequestHeaders.GetResponse().GetClearRouteCache()
			if ex.Destination == "" || ex.Destination != ex.Metadata {
				return nil, nil, g.violation(w, ex, fmt.Sprintf("destination header %q and metadata %q differ", ex.Destination, ex.Metadata))
			}
			mut = v.RequestHeaders.GetResponse().GetHeaderMutation()
			if mut == nil {
				mut = &extprocv3.HeaderMutation{}
			}
			if !hasBody {
				return mut, nil, true
			}
		case *extprocv3.ProcessingResponse_RequestBody:
			if mut == nil {
				return nil, nil, g.violation(w, ex, "body answered before the headers")
			}
			b, eos, err := StreamedBody(v.RequestBody.GetResponse())
			if err != nil {
				return nil, nil, g.violation(w, ex, err.Error())
			}
			ex.BodyChunks = append(ex.BodyChunks, len(b))
			body = append(body, b...)
			if eos {
				return mut, body, true
			}
		default:
			return nil, nil, g.violation(w, ex, fmt.Sprintf("unexpected %T in the request phase", v))
		}
	}
}

func (g *Gateway) violation(w http.ResponseWriter, ex *Exchange, msg string) bool {
	ex.Err = errors.New(msg)
	http.Error(w, "ext_proc protocol: "+msg, http.StatusBadGateway)
	return false
}

// forward sends the request to the answer's endpoints in order, going to
// the next one when one cannot be connected to (Envoy's retry on
// connect-failure), then runs the response phase.
func (g *Gateway) forward(ctx context.Context, s *Stream, w http.ResponseWriter, r *http.Request, h http.Header, body []byte, ex *Exchange) {
	var resp *http.Response
	var err error
	for _, ep := range strings.Split(ex.Destination, ",") {
		out, rerr := http.NewRequestWithContext(ctx, r.Method, "http://"+ep+r.URL.RequestURI(), bytesReader(body))
		if rerr != nil {
			err = rerr
			break
		}
		out.Header = h.Clone()
		out.Header.Del(headerDestination)
		out.ContentLength = int64(len(body))
		resp, err = g.transport().RoundTrip(out)
		if err == nil {
			ex.Served = ep
			break
		}
		var oe *net.OpError
		if !errors.As(err, &oe) || oe.Op != "dial" {
			break
		}
	}
	if err != nil {
		// Envoy's local reply also goes through the filter: the picker
		// sees a 503 without a served endpoint.
		ex.Err = err
		ex.Status = http.StatusServiceUnavailable
		if s.Send(ResponseHeaders(http.StatusServiceUnavailable, http.Header{"Content-Type": {"text/plain"}}, true, "")) == nil {
			_, _ = s.Recv()
		}
		http.Error(w, "no healthy upstream", http.StatusServiceUnavailable)
		return
	}
	defer resp.Body.Close()
	ex.Status = resp.StatusCode
	g.responsePhase(s, w, resp, ex)
}

func bytesReader(b []byte) io.Reader {
	if len(b) == 0 {
		return http.NoBody
	}
	return strings.NewReader(string(b))
}

// responsePhase passes the worker's answer through the picker: headers,
// then the body chunk by chunk, each chunk the picker sends back written
// to the client at once.
func (g *Gateway) responsePhase(s *Stream, w http.ResponseWriter, resp *http.Response, ex *Exchange) {
	served := ex.Served
	if g.NoServedReport {
		served = ""
	}
	rh := http.Header{}
	for k, vv := range resp.Header {
		if !hopByHop[k] {
			rh[k] = vv
		}
	}
	empty := resp.ContentLength == 0
	if err := s.Send(ResponseHeaders(resp.StatusCode, rh, empty, served)); err != nil {
		ex.Err = err
		return
	}
	m, err := s.Recv()
	if err != nil || m.GetResponseHeaders() == nil {
		ex.Err = fmt.Errorf("response headers answer: %v %v", m, err)
		http.Error(w, "ext_proc: response headers not answered", http.StatusBadGateway)
		return
	}
	ApplyMutation(rh, m.GetResponseHeaders().GetResponse().GetHeaderMutation())
	for k, vv := range rh {
		w.Header()[k] = vv
	}
	if empty {
		ex.answered()
		w.WriteHeader(resp.StatusCode)
		if err := s.Close(); err != nil {
			ex.Err = err
		}
		return
	}
	w.WriteHeader(resp.StatusCode)
	flusher, _ := w.(http.Flusher)
	relayed := make(chan error, 1)
	go func() {
		for {
			m, err := s.Recv()
			if err != nil {
				relayed <- err
				return
			}
			b, eos, err := StreamedBody(m.GetResponseBody().GetResponse())
			if err != nil {
				relayed <- err
				return
			}
			if eos {
				// The whole answer is in: the client may hang up once it
				// has it, the stream ends normally anyway.
				ex.answered()
			}
			if _, err := w.Write(b); err != nil {
				relayed <- err
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
			if eos {
				relayed <- nil
				return
			}
		}
	}()
	buf := make([]byte, g.chunk())
	left := resp.ContentLength
	for {
		n, rerr := resp.Body.Read(buf)
		if left -= int64(n); n > 0 {
			// With a known length the last bytes end the stream; a stream
			// of unknown length ends with an empty chunk once it is over.
			if err := s.Send(ResponseBody(append([]byte(nil), buf[:n]...), left == 0, served)); err != nil {
				ex.Err = err
				break
			}
			if left == 0 {
				break
			}
		}
		if rerr != nil {
			if rerr == io.EOF {
				if err := s.Send(ResponseBody(nil, true, served)); err != nil {
					ex.Err = err
				}
			} else {
				ex.Err = rerr
			}
			break
		}
	}
	if ex.Err != nil {
		s.Reset()
	}
	if err := <-relayed; err != nil && ex.Err == nil {
		ex.Err = err
	}
	ex.answered()
	if ex.Err == nil {
		if err := s.Close(); err != nil {
			ex.Err = err
		}
	}
}

// serveStatic forwards to g.Static as the picker path forwards, minus the
// picker: the body read whole, the answer relayed chunk by chunk.
func (g *Gateway) serveStatic(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, "http://"+g.Static+r.URL.RequestURI(), bytesReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	for k, vv := range r.Header {
		if !hopByHop[k] {
			out.Header[k] = vv
		}
	}
	out.ContentLength = int64(len(body))
	resp, err := g.transport().RoundTrip(out)
	if err != nil {
		http.Error(w, "no healthy upstream", http.StatusServiceUnavailable)
		return
	}
	defer resp.Body.Close()
	for k, vv := range resp.Header {
		if !hopByHop[k] {
			w.Header()[k] = vv
		}
	}
	w.WriteHeader(resp.StatusCode)
	flusher, _ := w.(http.Flusher)
	buf := make([]byte, g.chunk())
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if _, err := w.Write(buf[:n]); err != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		if rerr != nil {
			return
		}
	}
}
