package zmtpguard

import (
	"errors"
	"net"
	"os"
	"sync"
	"time"
)

// conn checks what its peer sends before zmq4 reads it. zmq4 reads from
// one goroutine per connection, so Read needs no lock; Close may come from
// any goroutine.
type conn struct {
	net.Conn
	lim  *Limits
	ck   checker
	unit [greetingLen]byte
	n    int    // bytes of unit collected
	out  []byte // checked unit bytes not yet handed to zmq4
	err  error  // sticky: once refused, always refused

	// open: the handshake deadline is still set.
	open bool

	closeOnce sync.Once
	release   func() // frees the listener's connection slot
}

func wrap(c net.Conn, lim *Limits, release func()) *conn {
	g := &conn{Conn: c, lim: lim, release: release, open: true}
	g.ck = checker{maxMessage: uint64(lim.maxMessage()), maxFrames: lim.maxFrames()}
	// Until the handshake is done: a peer that stays silent must not hold
	// zmq4's accept loop (it handshakes each connection in turn) or a dial.
	_ = c.SetDeadline(time.Now().Add(lim.handshakeTimeout()))
	return g
}

func (g *conn) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	if len(g.out) > 0 {
		n := copy(p, g.out)
		g.out = g.out[n:]
		return n, nil
	}
	if g.ck.greeted && g.ck.body > 0 {
		n, err := g.Conn.Read(p[:min(uint64(len(p)), g.ck.body)])
		g.ck.consumed(n)
		g.afterBody()
		if err != nil {
			return n, g.readErr(err)
		}
		return n, nil
	}
	// A greeting or a frame header: collect it whole, check it, then
	// release it. zmq4 allocates from a header's size as soon as it has
	// the header, so no part of an unchecked one may reach it.
	for {
		need := g.ck.need(g.unit[:g.n])
		if need == 0 {
			break
		}
		n, err := g.Conn.Read(g.unit[g.n : g.n+need])
		g.n += n
		if err != nil && g.ck.need(g.unit[:g.n]) > 0 {
			return 0, g.readErr(err)
		}
	}
	if err := g.ck.unit(g.unit[:g.n]); err != nil {
		return 0, g.refuse(err)
	}
	g.out = g.unit[:g.n]
	g.n = 0
	g.afterBody() // a frame without a body may end the handshake
	n := copy(p, g.out)
	g.out = g.out[n:]
	return n, nil
}

// Write passes writes on; one the handshake deadline cut closes the
// connection (zmq4 would leave a connection whose greeting it could not
// send open, and its listener slot taken).
func (g *conn) Write(p []byte) (int, error) {
	n, err := g.Conn.Write(p)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && !g.ck.handshook() {
		_ = g.Close()
	}
	return n, err
}

// afterBody lifts the handshake deadline once the peer's READY is in.
func (g *conn) afterBody() {
	if g.open && g.ck.handshook() {
		_ = g.Conn.SetDeadline(time.Time{})
		g.open = false
	}
}

// readErr passes the transport's errors on, except the handshake
// deadline's, which closes the connection.
func (g *conn) readErr(err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) && !g.ck.handshook() {
		return g.refuse(violation(ReasonHandshake, "no handshake within the deadline"))
	}
	return err
}

func (g *conn) refuse(err error) error {
	g.err = err
	if v := (*Violation)(nil); errors.As(err, &v) {
		g.lim.reject(v.Reason, g.RemoteAddr(), v.Detail)
	}
	_ = g.Close()
	return err
}

func (g *conn) Close() error {
	err := g.Conn.Close()
	g.closeOnce.Do(func() {
		if g.release != nil {
			g.release()
		}
	})
	return err
}
