package server_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/dataplane/server"
)

// limitedServer serves a trivial handler through server.HTTPServer with a
// 200ms header timeout, 4 KiB header limit and 300ms idle timeout.
func limitedServer(t *testing.T) string {
	t.Helper()
	cfg := config.Default()
	cfg.Server.ReadHeaderTimeoutSecs = 0.2
	cfg.Server.MaxHeaderBytes = 4096
	cfg.Server.IdleTimeoutSecs = 0.3
	srv, err := server.HTTPServer(cfg, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}), discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	return ln.Addr().String()
}

// closedWithin reads from conn until the server closes it and returns how
// long that took (failing the test if it stays open for 5s).
func closedWithin(t *testing.T, conn net.Conn) time.Duration {
	t.Helper()
	start := time.Now()
	_ = conn.SetReadDeadline(start.Add(5 * time.Second))
	_, err := io.Copy(io.Discard, conn) // a 408 may come first; then EOF
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the server kept the connection open for 5s")
	}
	return time.Since(start)
}

// Slow headers are cut off: a client that sends part of a request and
// stalls is disconnected after about the header timeout.
func TestSlowHeadersAreCutOff(t *testing.T) {
	addr := limitedServer(t)
	for name, partial := range map[string]string{
		"half a request line":       "GET /v1/mod",
		"a few bytes":               "P",
		"request line, no blank":    "POST /v1/chat/completions HTTP/1.1\r\nHost: cart\r\n",
		"nothing sent at all":       "",
		"h2c preface, half of it":   "PRI * HTTP/2.0\r\n",
		"headers trickling in slow": "GET / HTTP/1.1\r\nX-A: 1\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := io.WriteString(conn, partial); err != nil {
				t.Fatal(err)
			}
			if d := closedWithin(t, conn); d > 2*time.Second {
				t.Fatalf("connection closed after %v, want about the 200ms header timeout", d)
			}
		})
	}
}

// Headers over max_header_bytes get 431.
func TestOversizedHeadersGet431(t *testing.T) {
	addr := limitedServer(t)
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
	req.Header.Set("X-Big", strings.Repeat("b", 16<<10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("status %d, want 431", resp.StatusCode)
	}
	// Headers within the limit pass.
	req.Header.Set("X-Big", strings.Repeat("b", 1000))
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d for a 1 KB header", resp.StatusCode)
	}
}

// An idle keep-alive connection is closed after the idle timeout.
func TestIdleKeepAliveConnectionClosed(t *testing.T) {
	addr := limitedServer(t)
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: cart\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("status %d close=%v", resp.StatusCode, resp.Close)
	}
	start := time.Now()
	_ = conn.SetReadDeadline(start.Add(5 * time.Second))
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("unexpected data on an idle connection")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("idle connection kept open for 5s (idle timeout 300ms)")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("idle connection closed after %v", d)
	}
}
