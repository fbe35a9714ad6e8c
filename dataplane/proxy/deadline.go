package proxy

import (
	"io"
	"net"
	"sync"
	"time"
)

// A read deadline only matters to a read: one blocked when it is set, or
// one that starts later. But net/http's server changes the read deadline
// of a client connection about eight times per keep-alive request (idle
// wait, header wait, cleared; the proxy's body wait, cleared; the
// background read's start, abort and clear), and the worker side twice
// more, while most of them are replaced before any read reaches the
// socket: the request, body included, usually arrives in one segment that
// the first read of the idle wait takes whole. Each change costs a lock
// and a timer update in the runtime's poller. lazyConn records a read
// deadline and hands it to the socket only when a read needs it (at once
// when a read is blocked): TestLazyReadDeadlinesPerRequest counts 2
// changes per request left on the client side, and the worker side keeps
// one (the header timeout; its clear waits for the next request's).
// Write deadlines are passed on at once.

// LazyReadDeadlines wraps ln so that its connections apply read deadlines
// only when a read needs them; see lazyConn.
func LazyReadDeadlines(ln net.Listener) net.Listener { return lazyListener{ln} }

type lazyListener struct{ net.Listener }

func (l lazyListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return newLazyConn(c), nil
}

// lazyConn is a connection whose read deadline reaches the socket only
// before a read, or at once while one is in progress. A deadline already
// past when the read starts still fails it at once, as it would have if
// set on the socket directly, so reads see the same deadlines as before.
type lazyConn struct {
	net.Conn

	mu      sync.Mutex
	want    time.Time // the read deadline last asked for
	applied time.Time // the one the socket has
	reading int       // reads in progress
}

func newLazyConn(c net.Conn) *lazyConn { return &lazyConn{Conn: c} }

// sync hands the socket the read deadline asked for; mu is held.
func (c *lazyConn) sync() {
	if !c.want.Equal(c.applied) {
		// An error means a closed connection, which the read reports.
		_ = c.Conn.SetReadDeadline(c.want)
		c.applied = c.want
	}
}

func (c *lazyConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	c.sync()
	c.reading++
	c.mu.Unlock()
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	c.reading--
	c.mu.Unlock()
	return n, err
}

func (c *lazyConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.want = t
	if c.reading > 0 {
		// A blocked read must see it now (an abort, a shortened wait).
		err := c.Conn.SetReadDeadline(t)
		c.applied = t
		return err
	}
	return nil
}

func (c *lazyConn) SetDeadline(t time.Time) error {
	err := c.Conn.SetWriteDeadline(t)
	if rerr := c.SetReadDeadline(t); err == nil {
		err = rerr
	}
	return err
}

// CloseWrite passes the half-close on: net/http's server uses it to let
// the client read an error answer before the connection goes.
func (c *lazyConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// ReadFrom keeps the socket's sendfile and splice paths: only reads from
// the other side are done, never from this connection.
func (c *lazyConn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

// raw returns the socket with the read deadline asked for applied, for a
// raw read: the poller checks the socket's deadline before one.
func (c *lazyConn) raw() net.Conn {
	c.mu.Lock()
	c.sync()
	c.mu.Unlock()
	return c.Conn
}
