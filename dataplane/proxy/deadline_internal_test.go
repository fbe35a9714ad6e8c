package proxy

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// countConn counts the read deadlines that reach the connection.
type countConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countConn) SetReadDeadline(t time.Time) error {
	c.n.Add(1)
	return c.Conn.SetReadDeadline(t)
}

func (c countConn) SetDeadline(t time.Time) error {
	c.n.Add(1)
	return c.Conn.SetDeadline(t)
}

type countListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countConn{c, l.n}, nil
}

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func TestLazyConnAppliesDeadlineOnRead(t *testing.T) {
	client, server := tcpPair(t)
	var n atomic.Int64
	c := newLazyConn(countConn{server, &n})
	for i := range 3 {
		_ = c.SetReadDeadline(time.Now().Add(time.Duration(i+1) * time.Minute))
	}
	_ = c.SetReadDeadline(time.Time{})
	_ = c.SetReadDeadline(time.Now().Add(time.Hour))
	if got := n.Load(); got != 0 {
		t.Fatalf("%d deadlines reached the socket before any read, want 0", got)
	}
	if _, err := client.Write([]byte("ab")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	for range 2 {
		if _, err := c.Read(buf); err != nil {
			t.Fatal(err)
		}
	}
	if got := n.Load(); got != 1 {
		t.Fatalf("%d deadlines reached the socket for two reads under one deadline, want 1", got)
	}
}

func TestLazyConnPastDeadlineFailsRead(t *testing.T) {
	_, server := tcpPair(t)
	c := newLazyConn(server)
	_ = c.SetReadDeadline(time.Now().Add(-time.Second))
	start := time.Now()
	_, err := c.Read(make([]byte, 1))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after a past deadline: %v, want a deadline error", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("read waited %s", d)
	}
	// Lifted, the next read waits for data as usual.
	_ = c.SetReadDeadline(time.Time{})
	c.mu.Lock()
	c.sync()
	applied := c.applied
	c.mu.Unlock()
	if !applied.IsZero() {
		t.Fatalf("applied deadline %v after clearing", applied)
	}
}

func TestLazyConnDeadlineInterruptsBlockedRead(t *testing.T) {
	_, server := tcpPair(t)
	c := newLazyConn(server)
	done := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 1))
		done <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); ; {
		c.mu.Lock()
		reading := c.reading
		c.mu.Unlock()
		if reading > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the read never started")
		}
		time.Sleep(time.Millisecond)
	}
	_ = c.SetReadDeadline(aLongTimeAgo)
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("blocked read ended with %v, want a deadline error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a deadline set during a blocked read did not end it")
	}
}

// TestLazyReadDeadlinesPerRequest counts the read deadline changes that
// reach a client connection of net/http's server per keep-alive request,
// with the server's timeouts on and a handler that bounds its body read
// as readBody does.
func TestLazyReadDeadlinesPerRequest(t *testing.T) {
	const requests = 50
	perRequest := func(lazy bool) float64 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var n atomic.Int64
		var sl net.Listener = countListener{ln, &n}
		if lazy {
			sl = LazyReadDeadlines(sl)
		}
		srv := &http.Server{
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       time.Minute,
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				rc := http.NewResponseController(w)
				_ = rc.SetReadDeadline(time.Now().Add(time.Minute))
				body, err := io.ReadAll(r.Body)
				_ = rc.SetReadDeadline(time.Time{})
				if err != nil || string(body) != "ping" {
					http.Error(w, "bad body", http.StatusBadRequest)
					return
				}
				_, _ = io.WriteString(w, "pong")
			}),
		}
		served := make(chan struct{})
		go func() { defer close(served); _ = srv.Serve(sl) }()
		tr := &http.Transport{MaxIdleConnsPerHost: 1}
		hc := &http.Client{Transport: tr}
		for range requests {
			resp, err := hc.Post("http://"+ln.Addr().String()+"/", "text/plain", strings.NewReader("ping"))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != "pong" {
				t.Fatalf("answer %q", b)
			}
		}
		tr.CloseIdleConnections()
		_ = srv.Close()
		<-served
		return float64(n.Load()) / requests
	}
	eager, lazy := perRequest(false), perRequest(true)
	t.Logf("read deadline changes per request: %.1f direct, %.1f lazy", eager, lazy)
	if lazy > 4 || lazy > eager-2 {
		t.Fatalf("lazy read deadlines: %.1f socket changes per request (direct: %.1f), want at most 4 and 2 fewer", lazy, eager)
	}
}
