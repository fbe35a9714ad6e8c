package bufconn

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// countingConn counts the reads that reach the connection.
type countingConn struct {
	net.Conn
	reads atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	c.reads.Add(1)
	return c.Conn.Read(p)
}

// oneConn is a listener that hands out one conn, then fails.
type oneConn struct {
	c    net.Conn
	done bool
}

func (l *oneConn) Accept() (net.Conn, error) {
	if l.done {
		return nil, net.ErrClosed
	}
	l.done = true
	return l.c, nil
}
func (l *oneConn) Close() error   { return nil }
func (l *oneConn) Addr() net.Addr { return l.c.LocalAddr() }

// accept returns the conn a buffered listener of size makes of server,
// closed when the test ends.
func accept(t *testing.T, server net.Conn, size int) net.Conn {
	t.Helper()
	c, err := Listener(&oneConn{c: server}, size).Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// readFrames reads n frames the way Go's HTTP/2 framer does: the 9-byte
// header, then the payload, each its own Read.
func readFrames(t *testing.T, r io.Reader, n, payload int) {
	t.Helper()
	hdr, body := make([]byte, 9), make([]byte, payload)
	for i := range n {
		if _, err := io.ReadFull(r, hdr); err != nil {
			t.Fatalf("frame %d header: %v", i, err)
		}
		if _, err := io.ReadFull(r, body); err != nil {
			t.Fatalf("frame %d payload: %v", i, err)
		}
	}
}

func TestFramesArrivedTogetherCostOneRead(t *testing.T) {
	const frames, payload = 10, 100
	for _, buffered := range []bool{false, true} {
		server, client := net.Pipe()
		cc := &countingConn{Conn: server}
		var ln net.Listener = &oneConn{c: cc}
		if buffered {
			ln = Listener(ln, 0)
		}
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			// One write: the frames are all there when the server reads.
			_, _ = client.Write(make([]byte, frames*(9+payload)))
		}()
		readFrames(t, c, frames, payload)
		_ = c.Close()
		_ = client.Close()
		want := int64(1)
		if !buffered {
			want = 2 * frames
		}
		if got := cc.reads.Load(); got != want {
			t.Errorf("buffered=%v: %d reads of the connection, want %d", buffered, got, want)
		}
	}
}

func TestLargeReadsBypassTheBuffer(t *testing.T) {
	server, client := net.Pipe()
	defer client.Close()
	cc := &countingConn{Conn: server}
	c := accept(t, cc, 16)
	want := make([]byte, 64)
	for i := range want {
		want[i] = byte(i)
	}
	go func() { _, _ = client.Write(want) }()
	got := make([]byte, 64)
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("read %v, want %v", got, want)
	}
	// A read as large as the buffer goes to the connection directly: one
	// read of it, not four buffer fills.
	if n := cc.reads.Load(); n != 1 {
		t.Fatalf("%d reads of the connection for 64 bytes through a 16-byte buffer, want 1", n)
	}
}

func TestDeadlinesStillApply(t *testing.T) {
	server, client := net.Pipe()
	defer client.Close()
	c := accept(t, server, 0)
	if err := c.SetReadDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	_, err := c.Read(make([]byte, 1))
	if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("read past the deadline: %v, want a timeout", err)
	}
}

// halfCloser records CloseWrite.
type halfCloser struct {
	net.Conn
	closedWrite atomic.Bool
}

func (h *halfCloser) CloseWrite() error { h.closedWrite.Store(true); return nil }

func TestCloseWriteForwarded(t *testing.T) {
	server, client := net.Pipe()
	defer client.Close()
	hc := &halfCloser{Conn: server}
	c := accept(t, hc, 0)
	cw, ok := c.(interface{ CloseWrite() error })
	if !ok {
		t.Fatal("buffered conn has no CloseWrite")
	}
	if err := cw.CloseWrite(); err != nil || !hc.closedWrite.Load() {
		t.Fatalf("CloseWrite: err %v, forwarded %v", err, hc.closedWrite.Load())
	}
}

// An HTTP server on a buffered listener speaks HTTP/1.1 and h2c with
// prior knowledge, as the control plane's API does.
func TestHTTPServerBothProtocols(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{Protocols: &protos, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_, _ = w.Write([]byte(r.Proto + " " + string(b)))
	})}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(Listener(ln, 0)) }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}()
	var h2 http.Protocols
	h2.SetUnencryptedHTTP2(true)
	var h1 http.Protocols
	h1.SetHTTP1(true)
	for _, tc := range []struct {
		protos *http.Protocols
		want   string
	}{{&h1, "HTTP/1.1 hello"}, {&h2, "HTTP/2.0 hello"}} {
		tr := &http.Transport{Protocols: tc.protos, TLSClientConfig: &tls.Config{}}
		hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
		for range 3 { // reuse the connection
			resp, err := hc.Post("http://"+ln.Addr().String(), "text/plain", strings.NewReader("hello"))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if string(b) != tc.want {
				t.Fatalf("answer %q, want %q", b, tc.want)
			}
		}
		tr.CloseIdleConnections()
	}
}
