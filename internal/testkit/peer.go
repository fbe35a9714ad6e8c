package testkit

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// SendAndWaitClosed connects to addr over TCP, sends b and reports whether
// the peer closed the connection within 10 s (an EOF, or a reset when it
// left bytes unread), as a server must close a peer that sent garbage.
func SendAndWaitClosed(t testing.TB, addr string, b []byte) bool {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(b); err != nil {
		return true
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.Copy(io.Discard, c)
	return !errors.Is(err, os.ErrDeadlineExceeded)
}

// ZMTPCrashingFrame is issue 33's attack on a ZMQ listener: a ZMTP 3.0
// NULL greeting, then a long frame header claiming 2^62 bytes, 73 bytes in
// all. go-zeromq/zmq4 alone allocates the claimed size and panics.
func ZMTPCrashingFrame() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10] = 0xFF, 0x7F, 3
	copy(g[12:], "NULL")
	return append(g, binary.BigEndian.AppendUint64([]byte{0x02}, 1<<62)...)
}
