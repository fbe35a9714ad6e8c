package h1server

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// BenchmarkServe is one keep-alive client posting a small body and reading
// a small answer, on loopback, served by this package's loop and by
// net/http's server alone. Time and allocations per request include the
// client's side, which is the same in both.
func BenchmarkServe(b *testing.B) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","choices":[{"message":{"content":"ok"}}]}`)
	})
	body := bytes.Repeat([]byte("a"), 200)
	req := []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: cart\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + string(body))
	for _, bc := range []struct {
		name  string
		serve func(*http.Server, net.Listener) (stop func())
	}{
		{"h1server", func(srv *http.Server, ln net.Listener) func() {
			s := New(srv)
			done := make(chan struct{})
			go func() { defer close(done); _ = s.Serve(ln) }()
			return func() { _ = s.Close(); <-done }
		}},
		{"net-http", func(srv *http.Server, ln net.Listener) func() {
			done := make(chan struct{})
			go func() { defer close(done); _ = srv.Serve(ln) }()
			return func() { _ = srv.Close(); <-done }
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			stop := bc.serve(&http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}, ln)
			defer stop()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := c.Write(req); err != nil {
					b.Fatal(err)
				}
				if err := readAnswer(br); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// readAnswer reads one answer with a Content-Length body, minimally.
func readAnswer(br *bufio.Reader) error {
	n := -1
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return err
		}
		if len(line) == 2 {
			break
		}
		if v, ok := bytes.CutPrefix(line, []byte("Content-Length: ")); ok {
			n, _ = strconv.Atoi(string(bytes.TrimSpace(v)))
		}
	}
	if n < 0 {
		return io.ErrUnexpectedEOF
	}
	_, err := br.Discard(n)
	return err
}
