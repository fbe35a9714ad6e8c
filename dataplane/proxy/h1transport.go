package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"sync"
	"syscall"
	"time"
)

// h1Transport sends requests to plain-http workers over pooled HTTP/1.1
// connections, on the caller's goroutine. net/http's Transport hands every
// request to a writer goroutine and every response back from a reader
// goroutine, and returns the connection from a third wake-up: four
// goroutine switches per request, which on a busy machine cost the proxy
// more than anything it computes (profiled: bench/results/2026-12-01-proxy).
// Here the handler's goroutine writes the request, reads the answer, and
// puts the connection back when the body ends.
//
// The bytes on the wire are net/http's own (Request.Write, ReadResponse).
// Anything but plain http (https workers, HTTP/2) goes to other.
type h1Transport struct {
	dialer        *net.Dialer
	headerTimeout time.Duration // from the request written to the response headers; 0 = none
	idleTimeout   time.Duration
	maxIdle       int // idle connections kept per worker
	// maxHeaderBytes bounds the response headers read (net/http's
	// Transport default): a worker sending endless headers is an error,
	// not a growing buffer.
	maxHeaderBytes int64
	other          http.RoundTripper

	mu        sync.Mutex
	idle      map[string][]*h1Conn // host:port -> idle connections, most recent last
	lastSweep time.Time
}

func newH1Transport(connect, request time.Duration, other http.RoundTripper) *h1Transport {
	return &h1Transport{
		dialer:         &net.Dialer{Timeout: connect, KeepAlive: 30 * time.Second},
		headerTimeout:  request,
		idleTimeout:    90 * time.Second,
		maxIdle:        1024,
		maxHeaderBytes: 10 << 20,
		other:          other,
		idle:           map[string][]*h1Conn{},
	}
}

type h1Conn struct {
	net.Conn
	lim      *limitReader // under br: bounds what the headers may take
	br       *bufio.Reader
	bw       *bufio.Writer
	lastUsed time.Time
}

// maxH1Body is the largest request body sent here. The request is written
// before the answer is read, so a worker that answers early (a 413) without
// reading a body larger than the socket buffers would leave the write
// blocked; net/http's Transport reads while it writes, and for large
// uploads its hand-offs cost nothing next to the transfer.
const maxH1Body = 64 << 10

// max1xx is how many interim responses may precede the answer.
const max1xx = 5

// aLongTimeAgo, as a deadline, makes pending and future I/O fail at once.
var aLongTimeAgo = time.Unix(1, 0)

func (t *h1Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "http" || req.URL.Host == "" || req.ContentLength < 0 || req.ContentLength > maxH1Body {
		return t.other.RoundTrip(req)
	}
	ctx := req.Context()
	if err := ctx.Err(); err != nil {
		closeBody(req)
		return nil, err
	}
	addr := req.URL.Host
	if req.URL.Port() == "" {
		addr = net.JoinHostPort(req.URL.Hostname(), "80")
	}
	resendable := req.GetBody != nil && ctx.Value(noResendKey{}) == nil
	pc, reused, err := t.get(ctx, addr, resendable)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	resp, err := t.exchange(ctx, addr, pc, req)
	if err != nil && reused && req.GetBody != nil && ctx.Err() == nil &&
		(errors.Is(err, errWriteFailed) || resendable && errors.Is(err, errNothingBack)) {
		// The worker had closed the idle connection before it got a
		// byte of this request (a failed write), or closed it with
		// nothing said back on a connection not checked before use (see
		// get): it goes again, once, on a new connection.
		body, gerr := req.GetBody()
		if gerr != nil {
			return nil, err
		}
		retry := *req
		retry.Body = body
		if pc, err = t.dial(ctx, addr); err != nil {
			closeBody(&retry)
			return nil, err
		}
		return t.exchange(ctx, addr, pc, &retry)
	}
	return resp, err
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// errWriteFailed marks an error from writing the request.
var errWriteFailed = errors.New("writing the request")

// errNothingBack marks a connection that ended, or was reset, before a
// byte of the answer came.
var errNothingBack = errors.New("connection closed before any answer")

type nothingBackError struct{ err error }

func (e *nothingBackError) Error() string   { return e.err.Error() }
func (e *nothingBackError) Unwrap() []error { return []error{e.err, errNothingBack} }

// noResendKey, in a request's context, marks a request that must not be
// sent twice (a call that is not resendable): its connection is always
// checked before use, and it is never retried once written.
type noResendKey struct{}

// closedBeforeAnswer reports whether a failed read of the answer got
// nothing at all from the connection: an end of stream or a reset, with
// the header budget untouched and nothing buffered.
func closedBeforeAnswer(err error, pc *h1Conn, budget int64) bool {
	if pc.lim.n != budget || pc.br.Buffered() > 0 {
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

type writeError struct{ err error }

func (e *writeError) Error() string   { return e.err.Error() }
func (e *writeError) Unwrap() []error { return []error{e.err, errWriteFailed} }

// exchange writes req on pc and reads the response headers. The response
// body owns pc from then on and returns it to the pool when read to its
// end and closed.
func (t *h1Transport) exchange(ctx context.Context, addr string, pc *h1Conn, req *http.Request) (*http.Response, error) {
	stop := context.AfterFunc(ctx, func() { _ = pc.SetDeadline(aLongTimeAgo) })
	fail := func(err error) (*http.Response, error) {
		stop()
		_ = pc.Close()
		closeBody(req)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	err := writeRequest(pc.bw, req)
	if err == nil {
		err = pc.bw.Flush()
	}
	if err != nil {
		return fail(&writeError{err})
	}
	if t.headerTimeout > 0 {
		_ = pc.SetReadDeadline(time.Now().Add(t.headerTimeout))
		// A cancellation whose expired deadline this call just replaced
		// would be lost, and the read would wait out the header timeout
		// with the worker still holding the request: ctx.Err is set
		// before the AfterFunc runs, so checking after the set catches it.
		if ctx.Err() != nil {
			return fail(ctx.Err())
		}
	}
	var resp *http.Response
	trace := httptrace.ContextClientTrace(ctx)
	for n1xx := 0; ; n1xx++ {
		// Bytes already buffered were counted when read.
		pc.lim.n = t.maxHeaderBytes
		resp, err = readResponse(pc.br, req)
		if err != nil {
			if n1xx == 0 && closedBeforeAnswer(err, pc, t.maxHeaderBytes) {
				err = &nothingBackError{err}
			}
			return fail(err)
		}
		// Interim answers (100 Continue, 103 Early Hints) are not the
		// response (101 is, and relay refuses it): they go to the trace
		// hook (forward.go's interim), which passes them to the client, as
		// net/http's Transport does, up to its limit of 5.
		if resp.StatusCode < 100 || resp.StatusCode > 199 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
		if n1xx >= max1xx {
			return fail(errors.New("net/http: too many 1xx informational responses"))
		}
		if trace != nil && trace.Got1xxResponse != nil {
			if err := trace.Got1xxResponse(resp.StatusCode, textproto.MIMEHeader(resp.Header)); err != nil {
				return fail(err)
			}
		}
	}
	pc.lim.n = math.MaxInt64
	if t.headerTimeout > 0 {
		_ = pc.SetReadDeadline(time.Time{})
		if ctx.Err() != nil { // as above: the clear may have undone a cancellation
			// Not resp.Body.Close: that reads the body to its end, with no
			// deadline left, which for a stream is never. fail closes the
			// connection, which ends the body too.
			return fail(ctx.Err())
		}
	}
	b := &h1Body{rc: resp.Body, t: t, pc: pc, addr: addr, stop: stop, reusable: !resp.Close && !req.Close && resp.StatusCode != http.StatusSwitchingProtocols}
	if resp.Body == http.NoBody {
		b.eof = true
	}
	resp.Body = b
	return resp, nil
}

// h1Body is a response body on a pooled connection. Close may race with
// Read (a client abort): the connection goes back to the pool only after
// a read reached the end of the body, and is closed otherwise.
type h1Body struct {
	rc       io.ReadCloser
	t        *h1Transport
	pc       *h1Conn
	addr     string
	stop     func() bool
	reusable bool

	mu     sync.Mutex
	eof    bool
	closed bool
}

func (b *h1Body) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.mu.Lock()
		b.eof = true
		b.mu.Unlock()
	}
	return n, err
}

func (b *h1Body) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	eof := b.eof
	b.mu.Unlock()
	// stop reports false when the context already expired the
	// connection's deadlines: it cannot be used again.
	if b.stop() && eof && b.reusable {
		// Its deadlines are clear: the header timeout was lifted once the
		// headers came, and the context never fired.
		_ = b.rc.Close()
		b.t.put(b.addr, b.pc)
		return nil
	}
	// Closing an unfinished net/http body would read it to its end, which
	// for a stream may be never: close the connection instead.
	return b.pc.Close()
}

// checkAfter is how long a connection may sit idle and still be used
// without the peek of open. A worker closes idle connections after
// seconds, not milliseconds, so one back from a request moments ago is
// almost always still open; the peek is a syscall per request, and the
// rare connection found closed is caught by the retry in RoundTrip,
// which only a request that may be sent twice takes.
const checkAfter = time.Second

// get returns an idle connection to addr, or a new one. Unless
// resendable, a connection is always checked with open before use.
func (t *h1Transport) get(ctx context.Context, addr string, resendable bool) (pc *h1Conn, reused bool, err error) {
	for {
		t.mu.Lock()
		list := t.idle[addr]
		if len(list) == 0 {
			t.mu.Unlock()
			break
		}
		pc = list[len(list)-1]
		list[len(list)-1] = nil
		t.idle[addr] = list[:len(list)-1]
		t.mu.Unlock()
		idle := time.Since(pc.lastUsed)
		if idle < checkAfter && resendable && pc.br.Buffered() == 0 {
			return pc, true, nil
		}
		if idle < t.idleTimeout && pc.open() {
			return pc, true, nil
		}
		_ = pc.Close()
	}
	pc, err = t.dial(ctx, addr)
	return pc, false, err
}

func (t *h1Transport) dial(ctx context.Context, addr string) (*h1Conn, error) {
	c, err := t.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	lim := &limitReader{r: c, n: math.MaxInt64}
	return &h1Conn{Conn: c, lim: lim, br: bufio.NewReaderSize(lim, 4<<10), bw: bufio.NewWriterSize(c, 4<<10)}, nil
}

// limitReader fails reads once n bytes have been read.
type limitReader struct {
	r io.Reader
	n int64
}

var errHeadersTooLarge = errors.New("worker's response headers exceed the limit")

func (l *limitReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errHeadersTooLarge
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}

// open reports whether an idle connection is still usable: nothing to read
// (a close from the worker reads as EOF, stray bytes would be taken for
// the next answer). It costs one non-blocking read, and it is what spares
// a request the connection a worker closed while it sat idle (servers
// close idle keep-alive connections after seconds, uvicorn after 5, and
// all of them when shutting down): net/http's Transport learns the same
// from the reader goroutine it keeps on every connection.
func (pc *h1Conn) open() bool {
	if pc.br.Buffered() > 0 {
		return false
	}
	return connOpen(pc.Conn)
}

// put returns a connection to the pool, closing the ones idle too long.
func (t *h1Transport) put(addr string, pc *h1Conn) {
	now := time.Now()
	pc.lastUsed = now
	var stale []*h1Conn
	t.mu.Lock()
	list := append(t.idle[addr], pc)
	if len(list) > t.maxIdle {
		stale = append(stale, list[0])
		list = list[1:]
	}
	t.idle[addr] = list
	if now.Sub(t.lastSweep) > t.idleTimeout/2 {
		// Workers that left the pool get no more requests: their idle
		// connections are found here.
		t.lastSweep = now
		for a, l := range t.idle {
			n := 0
			for n < len(l) && now.Sub(l[n].lastUsed) > t.idleTimeout {
				n++
			}
			stale = append(stale, l[:n]...)
			if n == len(l) {
				delete(t.idle, a)
			} else if n > 0 {
				t.idle[a] = append(l[:0:0], l[n:]...)
			}
		}
	}
	t.mu.Unlock()
	for _, c := range stale {
		_ = c.Close()
	}
}
