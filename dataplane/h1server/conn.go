package h1server

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// connState is what Shutdown needs to know of a connection: whether it
// waits for a request (idle, or new and never used) and may be closed.
type connState int32

const (
	stateNew connState = iota
	stateActive
	stateIdle
)

const (
	bufSize = 4096
	// watchDelay is how long a request waits on its answer before the
	// connection is watched for the client leaving. Most answers of a
	// proxy in front of a fast replica come sooner, and skip the watch's
	// read, deadline and wake-ups; a request to a model that is left
	// unanswered is cancelled within about this much of the client going.
	watchDelay = 50 * time.Millisecond
	// maxDrain is how much of a body the handler left unread is read and
	// dropped to keep the connection; beyond it the connection closes.
	maxDrain = 256 << 10
)

// conn is one client connection served by the fast loop.
type conn struct {
	srv     *Server
	rwc     net.Conn // the connection served: raw, or TLS over raw
	raw     net.Conn // the accepted one, which other goroutines close
	tls     *tls.ConnectionState
	remote  string
	state   atomic.Int32
	since   time.Time // when it was accepted, for Shutdown's view of new connections; set before serve
	br      *bufio.Reader
	bw      *bufio.Writer
	baseCtx context.Context

	// The departure watch of the request being served.
	watch     *time.Timer
	wmu       sync.Mutex
	wcond     *sync.Cond
	watching  bool               // a watch read is in flight
	watchOK   bool               // nothing of a next request is buffered: the watch may read
	reqOver   bool               // the request is finished: no watch may start
	cancelReq context.CancelFunc // the request's; called when the client leaves
	gotByte   bool               // the watch read a byte of the next request
	byteBuf   [1]byte

	pend     []byte
	lastPost bool // the last request was a POST (see nextHead)
}

func (c *conn) stale() bool { return time.Since(c.since) > 5*time.Second }

// Read is the buffered reader's source: a byte the watch read comes first.
func (c *conn) Read(p []byte) (int, error) {
	if c.gotByte && len(p) > 0 {
		c.gotByte = false
		p[0] = c.byteBuf[0]
		return 1, nil
	}
	return c.rwc.Read(p)
}

func (c *conn) serve() {
	c.remote = c.rwc.RemoteAddr().String()
	handed := false
	defer func() {
		if v := recover(); v != nil && v != http.ErrAbortHandler {
			buf := make([]byte, 64<<10)
			buf = buf[:runtime.Stack(buf, false)]
			c.logf("h1server: panic serving %s: %v\n%s", c.remote, v, buf)
		}
		if c.watch != nil {
			c.watch.Stop()
		}
		if !handed {
			_ = c.rwc.Close()
		}
		c.srv.forget(c)
		c.release()
	}()
	if cfg := c.srv.tlsConfig; cfg != nil {
		tc := tls.Server(c.rwc, cfg)
		c.rwc = tc
		if d := c.handshakeTimeout(); d > 0 {
			_ = tc.SetDeadline(time.Now().Add(d))
		}
		if err := tc.HandshakeContext(context.Background()); err != nil {
			c.logf("h1server: TLS handshake error from %s: %v", c.remote, err)
			return
		}
		_ = tc.SetDeadline(time.Time{})
		st := tc.ConnectionState()
		c.tls = &st
		if st.NegotiatedProtocol == "h2" {
			handed = c.handOff(nil)
			return
		}
	}
	c.br = readerPool.Get().(*bufio.Reader)
	c.br.Reset(c)
	c.bw = writerPool.Get().(*bufio.Writer)
	c.bw.Reset(c.rwc)
	c.wcond = sync.NewCond(&c.wmu)
	base := context.WithValue(context.Background(), http.ServerContextKey, c.srv.HTTP)
	c.baseCtx = context.WithValue(base, http.LocalAddrContextKey, c.rwc.LocalAddr())
	maxHead := c.srv.HTTP.MaxHeaderBytes
	if maxHead <= 0 {
		maxHead = http.DefaultMaxHeaderBytes
	}
	maxHead = min(maxHead, bufSize)
	for first := true; ; first = false {
		h, v, err := c.nextHead(first, maxHead)
		if err != nil {
			return
		}
		if v == handOff {
			handed = c.handOff(c.br)
			return
		}
		c.state.Store(int32(stateActive))
		c.lastPost = h.method == http.MethodPost
		keep := c.serveOne(&h)
		if !keep || c.srv.shutdown.Load() {
			return
		}
		c.state.Store(int32(stateIdle))
		if c.srv.shutdown.Load() {
			return
		}
	}
}

func (c *conn) logf(format string, args ...any) {
	if l := c.srv.HTTP.ErrorLog; l != nil {
		l.Printf(format, args...)
	}
}

func (c *conn) handshakeTimeout() time.Duration {
	h := c.srv.HTTP
	var d time.Duration
	for _, t := range []time.Duration{h.ReadHeaderTimeout, h.ReadTimeout, h.WriteTimeout} {
		if t > 0 && (d == 0 || t < d) {
			d = t
		}
	}
	return d
}

// nextHead waits for the next request head: up to the idle timeout for
// its first bytes (between requests), up to the header timeout for the
// rest. Errors end the connection quietly, as net/http's do. Between
// requests it reads as net/http does, so that a connection handed over
// later gets the same bytes: it waits for four bytes (closing on fewer),
// and after a POST it drops up to four leading CR or LF bytes, which old
// clients sent after a body.
func (c *conn) nextHead(first bool, maxHead int) (head, verdict, error) {
	h := c.srv.HTTP
	// The first request's whole head is due within the header timeout of
	// the connection's start, as in net/http.
	deadlineSet := first
	want := 4
	if first {
		want = 1
	}
	if c.br.Buffered() < want {
		idle := h.IdleTimeout
		if idle == 0 {
			idle = h.ReadTimeout
		}
		if first || idle == 0 {
			idle = h.ReadHeaderTimeout
		}
		if idle > 0 {
			_ = c.rwc.SetReadDeadline(time.Now().Add(idle))
		} else {
			_ = c.rwc.SetReadDeadline(time.Time{})
		}
		if _, err := c.br.Peek(want); err != nil {
			return head{}, 0, err
		}
		if !first {
			c.state.Store(int32(stateActive))
		}
	}
	if c.lastPost {
		peek, _ := c.br.Peek(4)
		n := 0
		for n < len(peek) && (peek[n] == '\r' || peek[n] == '\n') {
			n++
		}
		_, _ = c.br.Discard(n)
	}
	for {
		buf, _ := c.br.Peek(c.br.Buffered())
		hd, v := parseHead(buf, maxHead)
		if v != incomplete {
			if v == taken {
				if _, err := c.br.Discard(hd.size); err != nil {
					return head{}, 0, err
				}
			}
			return hd, v, nil
		}
		if !deadlineSet && h.ReadHeaderTimeout > 0 {
			_ = c.rwc.SetReadDeadline(time.Now().Add(h.ReadHeaderTimeout))
			deadlineSet = true
		}
		if _, err := c.br.Peek(len(buf) + 1); err != nil {
			if err == io.EOF {
				// net/http reads a head cut short by the client's close as
				// far as it goes (and may answer 400), so it gets the
				// bytes (between requests, the four it waits for came).
				return head{}, handOff, nil
			}
			return head{}, 0, err
		}
	}
}

// handOff gives the connection to net/http with br's unread bytes.
func (c *conn) handOff(br *bufio.Reader) bool {
	if c.srv.shutdown.Load() {
		return false
	}
	_ = c.rwc.SetReadDeadline(time.Time{})
	var rest net.Conn = c.rwc
	if br != nil {
		// The bytes read so far, in order: a byte the watch read is
		// already in br once a head was looked at, but not before.
		var pending []byte
		if c.gotByte {
			pending = append(pending, c.byteBuf[0])
			c.gotByte = false
		}
		buf, _ := br.Peek(br.Buffered())
		pending = append(pending, buf...)
		// Wrapped also when nothing is pending over TLS, to carry the state.
		if len(pending) > 0 || c.tls != nil {
			rest = &handedConn{Conn: c.rwc, pending: pending, tls: c.tls}
		}
	}
	c.state.Store(int32(stateActive)) // net/http's now: never closed as idle here
	return c.srv.hand(rest)
}

// pendingBuf is the connection's buffer for a body held back until its
// head is sent; one response uses it at a time.
func (c *conn) pendingBuf() []byte {
	if c.pend == nil {
		c.pend = make([]byte, 0, bufSize)
	}
	return c.pend[:0]
}

// Buffers outlive connections: a client that opens one per request
// would otherwise cost 8 KiB of garbage each time.
var (
	readerPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, bufSize) }}
	writerPool = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, bufSize) }}
)

// release returns the buffers, once nothing reads them: a hand-off
// copied what was left.
func (c *conn) release() {
	if c.br != nil {
		c.br.Reset(nil)
		readerPool.Put(c.br)
		c.br = nil
	}
	if c.bw != nil {
		c.bw.Reset(nil)
		writerPool.Put(c.bw)
		c.bw = nil
	}
}

var emptyRequest = &http.Request{}

// serveOne runs the handler for one request and reports whether the
// connection may serve another.
func (c *conn) serveOne(h *head) (keep bool) {
	ctx, cancel := context.WithCancel(c.baseCtx)
	// WithContext is the one way to give a Request its context; it
	// copies, so it copies an empty one and the fields are set after.
	req := emptyRequest.WithContext(ctx)
	req.Method, req.URL, req.RequestURI, req.Host = h.method, h.url, h.target, h.host
	req.Proto, req.ProtoMajor, req.ProtoMinor = "HTTP/1.1", 1, 1
	req.Header, req.ContentLength, req.Close = h.header, h.contentLength, h.close
	req.RemoteAddr, req.TLS = c.remote, c.tls
	// One allocation for the rest of the request's parts.
	x := &struct {
		w    response
		body body
	}{}
	var bd *body
	if h.contentLength > 0 {
		bd = &x.body
		*bd = body{c: c, left: h.contentLength}
		req.Body = bd
	} else {
		req.Body = http.NoBody
	}
	w := &x.w
	*w = response{c: c, req: req, header: make(http.Header), cancel: cancel, reqBody: bd, closeAfter: h.close}

	c.wmu.Lock()
	// watchOK stays false until the body is read: a late timer of the last
	// request must not read this one's body off the connection.
	c.reqOver, c.watchOK, c.cancelReq = false, false, cancel
	c.wmu.Unlock()
	if bd == nil {
		c.armWatch()
	}
	aborted := c.runHandler(w, req)
	c.endWatch()
	cancel()
	if aborted {
		return false
	}
	if err := w.finish(); err != nil {
		return false
	}
	if w.closeAfter {
		return false
	}
	if bd != nil && bd.left > 0 {
		return bd.drain()
	}
	return true
}

// runHandler calls the handler; a panic ends the connection (logged
// unless it is http.ErrAbortHandler).
func (c *conn) runHandler(w *response, req *http.Request) (aborted bool) {
	defer func() {
		if v := recover(); v != nil {
			aborted = true
			if v != http.ErrAbortHandler {
				buf := make([]byte, 64<<10)
				buf = buf[:runtime.Stack(buf, false)]
				c.logf("h1server: panic serving %s: %v\n%s", c.remote, v, buf)
			}
		}
	}()
	c.srv.handler.ServeHTTP(w, req)
	return false
}

// armWatch starts the departure watch's delay: called once the request
// has no body left to read, since the watch reads the connection.
func (c *conn) armWatch() {
	c.wmu.Lock()
	c.watchOK = c.br.Buffered() == 0 && !c.gotByte
	c.wmu.Unlock()
	if c.watch == nil {
		c.watch = time.AfterFunc(watchDelay, c.watchRead)
		return
	}
	c.watch.Reset(watchDelay)
}

// watchRead reads the connection while the handler works: an error or
// EOF means the client left, and cancels the request; a byte is the
// start of a pipelined request, kept for the next head.
func (c *conn) watchRead() {
	c.wmu.Lock()
	if c.reqOver || c.watching || !c.watchOK {
		c.wmu.Unlock()
		return
	}
	// Under the lock, so that endWatch's expired deadline comes after: a
	// deadline left from the idle wait or the body read must not pass for
	// the client leaving.
	_ = c.rwc.SetReadDeadline(time.Time{})
	c.watching = true
	cancel := c.cancelReq
	c.wmu.Unlock()

	n, err := c.rwc.Read(c.byteBuf[:])

	c.wmu.Lock()
	if n == 1 {
		c.gotByte = true
	}
	var ne net.Error
	if err != nil && !(c.reqOver && errors.As(err, &ne) && ne.Timeout()) {
		cancel() // the client left (or its connection broke)
	}
	c.watching = false
	c.wcond.Broadcast()
	c.wmu.Unlock()
}

// endWatch ends the request's watch: no new one starts, and a read in
// flight is interrupted by an expired deadline and waited for.
func (c *conn) endWatch() {
	if c.watch != nil {
		c.watch.Stop()
	}
	c.wmu.Lock()
	c.reqOver = true
	if c.watching {
		_ = c.rwc.SetReadDeadline(time.Unix(1, 0))
		for c.watching {
			c.wcond.Wait()
		}
		_ = c.rwc.SetReadDeadline(time.Time{})
	}
	c.cancelReq = nil
	c.wmu.Unlock()
}

// body is a request body of a known length, read from the connection's
// buffer.
type body struct {
	c      *conn
	left   int64
	err    error
	closed bool
}

var errBodyClosed = errors.New("http: invalid Read on closed Body")

func (b *body) Read(p []byte) (int, error) {
	if b.closed {
		return 0, errBodyClosed
	}
	if b.err != nil {
		return 0, b.err
	}
	if b.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.c.br.Read(p)
	b.left -= int64(n)
	if b.left == 0 {
		b.c.armWatch()
		return n, io.EOF
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		b.err = err
	}
	return n, err
}

// Close leaves the rest of the body for the connection to drain after the
// response (or to close over).
func (b *body) Close() error {
	b.closed = true
	return nil
}

// drainable reports whether what is left of the body (if anything) is
// small enough to read and drop after the answer, keeping the connection.
func (b *body) drainable() bool {
	return b == nil || b.err == nil && b.left <= maxDrain
}

// drain reads and drops what the handler left of the body, up to maxDrain
// and for at most a second, and reports whether the connection survives.
func (b *body) drain() bool {
	if !b.drainable() {
		return false
	}
	_ = b.c.rwc.SetReadDeadline(time.Now().Add(time.Second))
	_, err := b.c.br.Discard(int(b.left))
	return err == nil
}
