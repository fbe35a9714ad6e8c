// Package bufconn buffers the reads of a plaintext listener's connections.
//
// Go's HTTP/2 server reads frames straight from the connection it is
// given: a 9-byte header, then the payload, each its own read syscall,
// even when the kernel already holds many frames. Over TLS the record
// layer buffers, but a plaintext (h2c) listener pays two syscalls per
// frame; on the control plane that was ~11% of the leader's CPU at 5,000
// routes/s. A buffered conn turns those into one read per batch of
// arrived bytes.
package bufconn

import (
	"bufio"
	"net"
)

// DefaultSize is the read buffer of each connection: an HTTP/2 frame is
// at most 16 KiB by default, and a few small ones fit in 8 KiB.
const DefaultSize = 8 << 10

// Listener wraps ln so that every accepted connection buffers its reads
// in size bytes (DefaultSize when size <= 0). Use it for plaintext
// listeners only: a TLS server needs the *net.TCPConn-backed conn, and
// already reads whole records.
func Listener(ln net.Listener, size int) net.Listener {
	if size <= 0 {
		size = DefaultSize
	}
	return &listener{Listener: ln, size: size}
}

type listener struct {
	net.Listener
	size int
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &conn{Conn: c, r: bufio.NewReaderSize(c, l.size)}, nil
}

// conn is a net.Conn whose reads come from a buffer. Deadlines still
// apply: the buffer is refilled only by a Read of the underlying conn.
type conn struct {
	net.Conn
	r *bufio.Reader
}

func (c *conn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite half-closes the connection when the underlying one can, as
// net/http does to let a client read an error before the close.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
