package testkit

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func echoListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { _ = ln.Close(); <-done })
	go func() {
		defer close(done)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				_ = c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
			go func() { _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

// echo writes msg on c and reads it back within wait.
func echo(c net.Conn, msg string, wait time.Duration) (string, error) {
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	return readWithin(c, len(msg), wait)
}

func readWithin(c net.Conn, n int, wait time.Duration) (string, error) {
	_ = c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, n)
	_, err := io.ReadFull(c, buf)
	return string(buf), err
}

func TestBlackholeHoldsWithoutClosingAndHealsNewConnectionsFirst(t *testing.T) {
	// Registered first, so it runs after every other cleanup.
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	b := NewBlackhole(t, echoListener(t))
	old, err := net.Dial("tcp", b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if got, err := echo(old, "a", 5*time.Second); got != "a" || err != nil {
		t.Fatalf("before the cut: %q, %v", got, err)
	}

	b.Cut()
	// Nothing comes back and nothing fails: a silence, not an error.
	if got, err := echo(old, "b", 100*time.Millisecond); !isTimeout(err) {
		t.Fatalf("cut, old connection: %q, %v; want a read timeout", got, err)
	}
	during, err := net.Dial("tcp", b.Addr()) // the kernel still accepts
	if err != nil {
		t.Fatal(err)
	}
	defer during.Close()
	if got, err := echo(during, "c", 100*time.Millisecond); !isTimeout(err) {
		t.Fatalf("cut, new connection: %q, %v; want a read timeout", got, err)
	}

	const stale = 500 * time.Millisecond
	b.Heal(stale)
	fresh, err := net.Dial("tcp", b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if got, err := echo(fresh, "d", 5*time.Second); got != "d" || err != nil {
		t.Fatalf("a connection made after the heal: %q, %v", got, err)
	}
	// The connections that lived through the cut stay silent for stale,
	// then deliver what was held, in order.
	if got, err := readWithin(old, 1, stale/5); !isTimeout(err) {
		t.Fatalf("old connection right after the heal: %q, %v; want a read timeout", got, err)
	}
	if got, err := readWithin(old, 1, 5*time.Second); got != "b" || err != nil {
		t.Fatalf("old connection after stale: %q, %v; want the held b", got, err)
	}
	if got, err := readWithin(during, 1, 5*time.Second); got != "c" || err != nil {
		t.Fatalf("connection made during the cut, after stale: %q, %v; want the held c", got, err)
	}
	if n := b.Accepted(); n != 3 {
		t.Fatalf("accepted %d connections, want 3", n)
	}
	b.Close()
	if _, err := readWithin(fresh, 1, 5*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("after Close a connection must end, got %v", err)
	}
}

func isTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }
