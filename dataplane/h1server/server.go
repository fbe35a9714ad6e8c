// Package h1server serves the client-facing listener: requests of the one
// common shape (HTTP/1.1 GET or POST, a Content-Length body) on a loop of
// its own, every other connection by net/http.
//
// net/http's server costs a proxy about a third of its CPU outside the
// handler (profile in bench/results/2026-12-02-proxy2): a background read
// per request to notice a client that leaves, and its abort; a
// cancellable context and its AfterFunc; sorted header writes. The loop
// here watches for a departed client only once a request has been waiting
// on its answer for watchDelay, and writes headers as they are.
//
// Nothing unusual is parsed here. A head the strict parser does not take
// (HTTP/1.0, chunked bodies, Expect, Upgrade, HTTP/2 prior knowledge,
// oversized or malformed heads) hands the connection, with its unread
// bytes, to the net/http server, which serves it from then on and
// answers its errors; TLS connections that negotiate h2 go there too.
package h1server

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Server serves HTTP.Handler on a listener, with HTTP's timeouts, header
// limit, TLS configuration, protocols and error log.
type Server struct {
	HTTP *http.Server

	handoff  *handoffListener
	shutdown atomic.Bool
	// handler is what the fast path calls: HTTP.Handler as given, before
	// start wraps net/http's in withHandoffTLS.
	handler http.Handler
	// tlsConfig is HTTP.TLSConfig as start left it (nil for plaintext).
	// Not HTTP.TLSConfig itself: net/http's Serve sets up HTTP/2 by
	// filling in a TLSConfig of its own when there is none, which would
	// make the fast path shake hands on plaintext connections.
	tlsConfig *tls.Config

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	served    chan error // net/http's Serve of the hand-offs returned
	started   bool
}

// New wraps srv, which must not be served by anything else.
func New(srv *http.Server) *Server {
	return &Server{HTTP: srv, listeners: map[net.Listener]struct{}{}, conns: map[*conn]struct{}{}}
}

// start runs net/http's server over the hand-off listener, once.
func (s *Server) start() {
	if s.started {
		return
	}
	s.started = true
	s.handoff = newHandoffListener()
	if tc := s.HTTP.TLSConfig; tc != nil {
		tc = tc.Clone()
		if len(tc.NextProtos) == 0 {
			if p := s.HTTP.Protocols; p == nil || p.HTTP2() {
				tc.NextProtos = append(tc.NextProtos, "h2")
			}
			tc.NextProtos = append(tc.NextProtos, "http/1.1")
		}
		// net/http sets up its HTTP/2 server when its TLSConfig offers h2;
		// the fast path's handshakes use the same configuration.
		s.HTTP.TLSConfig = tc
		s.tlsConfig = tc
	}
	s.handler = s.HTTP.Handler
	if s.handler == nil {
		s.handler = http.DefaultServeMux
	}
	if s.HTTP.ConnContext == nil {
		// A TLS connection handed over mid-stream is wrapped (it carries the
		// bytes already read), so net/http does not see a *tls.Conn: its
		// requests get their TLS state from the context instead.
		s.HTTP.ConnContext = handoffConnContext
		s.HTTP.Handler = withHandoffTLS(s.handler)
	}
	s.served = make(chan error, 1)
	go func() { s.served <- s.HTTP.Serve(s.handoff) }()
}

// Serve accepts connections on ln until it fails or Shutdown/Close is
// called, when it returns http.ErrServerClosed. TLS is negotiated here
// when HTTP.TLSConfig is set.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.shutdown.Load() {
		s.mu.Unlock()
		_ = ln.Close()
		return http.ErrServerClosed
	}
	s.start()
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
		_ = ln.Close()
	}()
	var backoff time.Duration
	for {
		rw, err := ln.Accept()
		if err != nil {
			if s.shutdown.Load() {
				return http.ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				// Out of descriptors or a passing failure: wait and retry, as
				// net/http does, rather than end the listener.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		c := s.newConn(rw)
		if c == nil {
			_ = rw.Close()
			continue
		}
		go c.serve()
	}
}

func (s *Server) newConn(rw net.Conn) *conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutdown.Load() {
		return nil
	}
	c := &conn{srv: s, rwc: rw, raw: rw, since: time.Now()}
	s.conns[c] = struct{}{}
	return c
}

func (s *Server) forget(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// Shutdown stops accepting, closes idle connections, and waits for the
// others to finish their requests or for ctx to end, as net/http's
// Shutdown does (for the connections it serves, it is called too).
func (s *Server) Shutdown(ctx context.Context) error {
	s.stop()
	httpDone := make(chan error, 1)
	go func() { httpDone <- s.HTTP.Shutdown(ctx) }()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !s.closeIdle() {
		select {
		case <-ctx.Done():
			<-httpDone
			return ctx.Err()
		case <-tick.C:
		}
	}
	err := <-httpDone
	s.waitServed()
	return err
}

// Close closes the listeners and every connection at once.
func (s *Server) Close() error {
	s.stop()
	err := s.HTTP.Close()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.raw.Close()
	}
	s.mu.Unlock()
	s.waitServed()
	return err
}

func (s *Server) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.shutdown.Store(true)
	for ln := range s.listeners {
		_ = ln.Close()
	}
	if !s.started {
		// net/http's Shutdown and Close want a server that may have run.
		s.start()
	}
}

func (s *Server) waitServed() {
	if err := <-s.served; err != nil {
		s.served <- err // later callers return too
	}
}

// closeIdle closes the connections that wait for a request and reports
// whether none is left.
func (s *Server) closeIdle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if st := connState(c.state.Load()); st == stateIdle || st == stateNew && c.stale() {
			_ = c.raw.Close()
		}
	}
	return len(s.conns) == 0
}

// hand gives a connection to net/http; false once it no longer accepts.
func (s *Server) hand(c net.Conn) bool { return s.handoff.push(c) }

// handoffListener feeds connections to net/http's Serve.
type handoffListener struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

var errListenerClosed = errors.New("h1server: hand-off listener closed")

func newHandoffListener() *handoffListener {
	return &handoffListener{ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *handoffListener) push(c net.Conn) bool {
	select {
	case l.ch <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, errListenerClosed
	}
}

func (l *handoffListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *handoffListener) Addr() net.Addr { return handoffAddr{} }

type handoffAddr struct{}

func (handoffAddr) Network() string { return "h1server" }
func (handoffAddr) String() string  { return "hand-off" }

// handedConn is a connection given to net/http with the bytes already
// read from it.
type handedConn struct {
	net.Conn
	pending []byte
	tls     *tls.ConnectionState
}

func (c *handedConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

type tlsStateKey struct{}

func handoffConnContext(ctx context.Context, c net.Conn) context.Context {
	if hc, ok := c.(*handedConn); ok && hc.tls != nil {
		return context.WithValue(ctx, tlsStateKey{}, hc.tls)
	}
	return ctx
}

func withHandoffTLS(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil {
			if st, ok := r.Context().Value(tlsStateKey{}).(*tls.ConnectionState); ok {
				r.TLS = st
			}
		}
		h.ServeHTTP(w, r)
	})
}
