package h1server

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// answers sends in on a new connection to addr, closes the sending side
// and returns the answers read until the server closes: status and body
// of each, then the reason reading stopped if it was not a clean end.
func answers(t *testing.T, addr string, in []byte) []string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	go func() {
		_, _ = c.Write(in)
		_ = c.(*net.TCPConn).CloseWrite()
	}()
	var out []string
	br := bufio.NewReader(c)
	for {
		if _, err := br.Peek(1); err != nil {
			if err != io.EOF {
				out = append(out, "read: "+err.Error())
			}
			return out
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return append(out, "bad answer: "+err.Error())
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return append(out, "bad body: "+err.Error())
		}
		out = append(out, fmt.Sprintf("%d %q", resp.StatusCode, b))
	}
}

// FuzzServe holds the whole loop to net/http's server: any bytes a client
// sends get the same answers (status and body of each, in order) from
// this package's server as from net/http's alone, whichever path each
// request takes. The handler echoes what it was given.
func FuzzServe(f *testing.F) {
	f.Add([]byte(post + post))
	f.Add([]byte("GET /a HTTP/1.1\r\nHost: h\r\n\r\nPOST /b HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"))
	f.Add([]byte("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nab"))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\nGET /after HTTP/1.1\r\nHost: h\r\n\r\n"))
	f.Add([]byte("GET / HTTP/1.0\r\n\r\nGET / HTTP/1.1\r\n\r\n"))
	f.Add([]byte("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabcGARBAGE\r\n\r\n"))
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "body: "+err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%s %s %s %q %d %v", r.Method, r.RequestURI, r.Host, b, r.ContentLength, r.Header)
	})
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			f.Fatal(err)
		}
		return ln
	}
	fastLn, stdLn := listen(), listen()
	fast := New(&http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second})
	std := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = fast.Serve(fastLn) }()
	go func() { defer wg.Done(); _ = std.Serve(stdLn) }()
	f.Cleanup(func() { _ = fast.Close(); _ = std.Close(); wg.Wait() })
	f.Fuzz(func(t *testing.T, in []byte) {
		want := answers(t, stdLn.Addr().String(), in)
		got := answers(t, fastLn.Addr().String(), in)
		// A server that closes with input unread makes the kernel reset the
		// connection, which can cost the client answers already sent: how
		// many depends on timing, not on the server. After a reset, only
		// the answers both read are compared.
		got, gr := untilReset(got)
		want, wr := untilReset(want)
		if gr || wr {
			n := min(len(got), len(want))
			got, want = got[:n], want[:n]
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("input %q\nnet/http: %q\nh1server: %q", in, want, got)
		}
	})
}

// untilReset cuts a list of answers at a connection reset and reports
// whether there was one.
func untilReset(a []string) ([]string, bool) {
	for i, s := range a {
		if strings.Contains(s, "connection reset") {
			return a[:i], true
		}
	}
	return a, false
}
