package h1server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// path says which server answered: "fast" for the loop here, "http" for
// net/http after a hand-off.
func path(w http.ResponseWriter) string {
	if _, ok := w.(*response); ok {
		return "fast"
	}
	return "http"
}

// echo answers the request's method, body and path taken.
var echo = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("X-Path", path(w))
	w.Header().Set("X-TLS", fmt.Sprint(r.TLS != nil))
	fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.Path, b)
})

// start serves h on a loopback listener through a Server built from srv
// (whose Handler is set to h) and returns its address and error log.
func start(t *testing.T, srv *http.Server, h http.Handler) (string, *Server, *testkit.SyncBuffer) {
	t.Helper()
	logs := &testkit.SyncBuffer{}
	srv.Handler = h
	srv.ErrorLog = log.New(logs, "", 0)
	if srv.ReadHeaderTimeout == 0 {
		srv.ReadHeaderTimeout = 5 * time.Second
	}
	s := New(srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		_ = s.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve returned %v, want http.ErrServerClosed", err)
		}
	})
	return ln.Addr().String(), s, logs
}

// raw writes req on a new connection and returns a reader of the answers.
func raw(t *testing.T, addr, req string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	return c, bufio.NewReader(c)
}

func readResp(t *testing.T, br *bufio.Reader, method string) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func postReq(body string) string {
	return fmt.Sprintf("POST /v1/chat HTTP/1.1\r\nHost: cart\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}

// A keep-alive client is served on the fast path, request after request
// on one connection, small answers with a Content-Length, Date and a
// sniffed Content-Type.
func TestKeepAliveOnTheFastPath(t *testing.T) {
	addr, _, _ := start(t, &http.Server{}, echo)
	var conns int
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
		if !i.Reused {
			conns++
		}
	}}
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	for i := range 5 {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat", strings.NewReader(fmt.Sprint("body ", i)))
		req = req.WithContext(httptrace.WithClientTrace(context.Background(), trace))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := fmt.Sprint("POST /v1/chat body ", i); string(b) != want || resp.Header.Get("X-Path") != "fast" {
			t.Fatalf("answer %q via %s, want %q via fast", b, resp.Header.Get("X-Path"), want)
		}
		if resp.ContentLength != int64(len(b)) || resp.Header.Get("Date") == "" || resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" {
			t.Fatalf("length %d, date %q, type %q", resp.ContentLength, resp.Header.Get("Date"), resp.Header.Get("Content-Type"))
		}
	}
	if conns != 1 {
		t.Fatalf("%d connections for 5 requests, want 1", conns)
	}
}

// Pipelined requests are answered in order.
func TestPipelining(t *testing.T) {
	addr, _, _ := start(t, &http.Server{}, echo)
	_, br := raw(t, addr, postReq("one")+postReq("two")+"GET /three HTTP/1.1\r\nHost: cart\r\n\r\n")
	for _, want := range []string{"POST /v1/chat one", "POST /v1/chat two", "GET /three "} {
		if _, got := readResp(t, br, "POST"); got != want {
			t.Fatalf("got %q, want %q", got, want)
		}
	}
}

// Requests of other shapes are handed to net/http with the bytes already
// read, and the connection goes on there.
func TestHandOffs(t *testing.T) {
	addr, _, _ := start(t, &http.Server{}, echo)
	for name, tc := range map[string]struct {
		req, want string
		status    int
	}{
		"chunked":  {req: "POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", want: "POST /c abc", status: 200},
		"HTTP/1.0": {req: "POST /o HTTP/1.0\r\nHost: h\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nhi", want: "POST /o hi", status: 200},
		"expect": {req: "POST /e HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi", want: "POST /e hi",
			status: 200},
		"no host":   {req: "GET / HTTP/1.1\r\n\r\n", status: 400},
		"smuggling": {req: "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", status: 400},
	} {
		t.Run(name, func(t *testing.T) {
			// A fast-path request first, so the hand-off happens mid-connection.
			_, br := raw(t, addr, postReq("first")+tc.req)
			if _, got := readResp(t, br, "POST"); got != "POST /v1/chat first" {
				t.Fatalf("first answer %q", got)
			}
			resp, got := readResp(t, br, "POST")
			if resp.StatusCode == http.StatusContinue {
				resp, got = readResp(t, br, "POST")
			}
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d (%q), want %d", resp.StatusCode, got, tc.status)
			}
			if tc.status == 200 && (got != tc.want || resp.Header.Get("X-Path") != "http") {
				t.Fatalf("answer %q via %s, want %q via http", got, resp.Header.Get("X-Path"), tc.want)
			}
		})
	}
}

// HTTP/2 with prior knowledge goes to net/http.
func TestH2CHandedOff(t *testing.T) {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	addr, _, _ := start(t, &http.Server{Protocols: &p}, echo)
	client := testkit.H2CClient()
	defer client.CloseIdleConnections()
	resp, err := client.Post("http://"+addr+"/x", "text/plain", strings.NewReader("h2"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 || string(b) != "POST /x h2" || resp.Header.Get("X-Path") != "http" {
		t.Fatalf("proto %s, answer %q via %s", resp.Proto, b, resp.Header.Get("X-Path"))
	}
}

// Over TLS, h2 goes to net/http and HTTP/1.1 to the fast path; a request
// handed off mid-connection still sees its TLS state.
func TestTLS(t *testing.T) {
	ca := testkit.NewCA(t)
	cert := ca.Issue(t, "server")
	addr, _, _ := start(t, &http.Server{TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}, echo)
	roots := &tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS12}

	h2 := &http.Client{Transport: &http.Transport{TLSClientConfig: roots, ForceAttemptHTTP2: true}}
	defer h2.CloseIdleConnections()
	resp, err := h2.Post("https://"+addr+"/x", "text/plain", strings.NewReader("two"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 || string(b) != "POST /x two" || resp.Header.Get("X-TLS") != "true" {
		t.Fatalf("h2: proto %s, answer %q, tls %s", resp.Proto, b, resp.Header.Get("X-TLS"))
	}

	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(c, postReq("one")+"POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
	br := bufio.NewReader(c)
	for _, want := range []string{"fast", "http"} {
		resp, _ := readResp(t, br, "POST")
		if resp.Header.Get("X-Path") != want || resp.Header.Get("X-TLS") != "true" {
			t.Fatalf("via %s with tls %s, want via %s with TLS", resp.Header.Get("X-Path"), resp.Header.Get("X-TLS"), want)
		}
	}
}

// Framing of answers: flushed or long bodies are chunked, a set
// Content-Length is kept, trailers follow the last chunk, bodiless
// statuses refuse a body, 1xx answers go out first.
func TestFraming(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/long", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(bytes.Repeat([]byte("x"), 3*bufSize))
	})
	mux.HandleFunc("/flushed", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "a")
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Error(err)
		}
		_, _ = io.WriteString(w, "b")
	})
	mux.HandleFunc("/length", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "5")
		_, _ = io.WriteString(w, "abc")
		if _, err := io.WriteString(w, "def"); !errors.Is(err, http.ErrContentLength) {
			t.Errorf("writing past Content-Length: %v", err)
		}
		_, _ = io.WriteString(w, "de")
	})
	mux.HandleFunc("/trailers", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Sum")
		_, _ = io.WriteString(w, "body")
		w.Header().Set("X-Sum", "42")
		w.Header().Set(http.TrailerPrefix+"X-Late", "7")
	})
	mux.HandleFunc("/nocontent", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
		if _, err := io.WriteString(w, "x"); !errors.Is(err, http.ErrBodyNotAllowed) {
			t.Errorf("body on 204: %v", err)
		}
	})
	mux.HandleFunc("/hints", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</a.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		_, _ = io.WriteString(w, "final")
	})
	mux.HandleFunc("/inject", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-A", "1\r\nX-Evil: 1")
		w.Header()["Bad Name"] = []string{"x"}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, "{}")
	})
	addr, _, _ := start(t, &http.Server{}, mux)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	get := func(p string, trace *httptrace.ClientTrace) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+p, nil)
		if trace != nil {
			req = req.WithContext(httptrace.WithClientTrace(context.Background(), trace))
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		return resp, string(b)
	}
	if resp, b := get("/long", nil); len(b) != 3*bufSize || resp.ContentLength != -1 || resp.TransferEncoding[0] != "chunked" {
		t.Fatalf("long: %d bytes, length %d, te %v", len(b), resp.ContentLength, resp.TransferEncoding)
	}
	if resp, b := get("/flushed", nil); b != "ab" || resp.ContentLength != -1 {
		t.Fatalf("flushed: %q, length %d", b, resp.ContentLength)
	}
	if resp, b := get("/length", nil); b != "abcde" || resp.ContentLength != 5 {
		t.Fatalf("length: %q, length %d", b, resp.ContentLength)
	}
	if resp, b := get("/trailers", nil); b != "body" || resp.Trailer.Get("X-Sum") != "42" || resp.Trailer.Get("X-Late") != "7" {
		t.Fatalf("trailers: %q, %v", b, resp.Trailer)
	}
	if resp, b := get("/nocontent", nil); resp.StatusCode != 204 || b != "" {
		t.Fatalf("204: %d %q", resp.StatusCode, b)
	}
	var hint string
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		hint = fmt.Sprint(code, " ", h.Get("Link"))
		return nil
	}}
	if resp, b := get("/hints", trace); b != "final" || hint != "103 </a.css>; rel=preload" || resp.Header.Get("Link") != "" {
		t.Fatalf("hints: %q, hint %q, final link %q", b, hint, resp.Header.Get("Link"))
	}
	if resp, _ := get("/inject", nil); resp.Header.Get("X-Evil") != "" || resp.Header.Get("X-A") != "1  X-Evil: 1" ||
		resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("inject: %v", resp.Header)
	}
}

// A handler that promises more than it writes cannot leave the client
// waiting on the connection: it is closed.
func TestShortBodyClosesConnection(t *testing.T) {
	addr, _, _ := start(t, &http.Server{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "10")
		_, _ = io.WriteString(w, "abc")
	}))
	_, br := raw(t, addr, "GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(resp.Body); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("reading a short body: %v, want unexpected EOF", err)
	}
}

// A body the handler does not read is drained when small (the connection
// goes on) and closes the connection when large.
func TestUnreadBody(t *testing.T) {
	addr, _, _ := start(t, &http.Server{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, r.URL.Path)
	}))
	_, br := raw(t, addr, postReq(strings.Repeat("a", 1000))+postReq("b"))
	for _, want := range []string{"/v1/chat", "/v1/chat"} {
		if _, got := readResp(t, br, "POST"); got != want {
			t.Fatalf("got %q", got)
		}
	}
	big := fmt.Sprintf("POST /big HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n", maxDrain+1)
	c, br := raw(t, addr, big)
	resp, got := readResp(t, br, "POST")
	if got != "/big" || !resp.Close {
		t.Fatalf("answer %q, close %v", got, resp.Close)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after a large unread body: %v, want the connection closed", err)
	}
}

// A client that leaves while its request waits cancels the request's
// context; a client that sends its next request meanwhile does not, and
// that request is served whole.
func TestClientDeparture(t *testing.T) {
	cancelled := make(chan string, 4)
	addr, _, _ := start(t, &http.Server{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		select {
		case <-r.Context().Done():
			cancelled <- r.URL.Path
		case <-time.After(3 * watchDelay):
		}
		_, _ = io.WriteString(w, r.URL.Path)
	}))

	c, _ := raw(t, addr, "GET /gone HTTP/1.1\r\nHost: h\r\n\r\n")
	time.Sleep(watchDelay / 2)
	_ = c.Close()
	select {
	case p := <-cancelled:
		if p != "/gone" {
			t.Fatalf("cancelled %s", p)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the request of a client that left was not cancelled")
	}

	c, br := raw(t, addr, postReq("first"))
	time.Sleep(2 * watchDelay) // the watch reads the next request's first byte
	_, _ = io.WriteString(c, "GET /second HTTP/1.1\r\nHost: h\r\n\r\n")
	for _, want := range []string{"/v1/chat", "/second"} {
		if _, got := readResp(t, br, "POST"); got != want {
			t.Fatalf("got %q, want %q", got, want)
		}
	}
	select {
	case p := <-cancelled:
		t.Fatalf("%s cancelled though its client stayed", p)
	default:
	}
}

// A write to a client that is gone cancels the request.
func TestWriteErrorCancels(t *testing.T) {
	cancelled := make(chan error, 1)
	addr, _, _ := start(t, &http.Server{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		for range 1000 {
			if _, err := w.Write(chunk); err != nil {
				break
			}
		}
		cancelled <- r.Context().Err()
	}))
	c, br := raw(t, addr, "GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	if _, err := br.Peek(1); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	select {
	case err := <-cancelled:
		if err == nil {
			t.Fatal("the request went on after its writes failed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler kept writing to a closed connection")
	}
}

// A panic closes the connection and is logged, unless it is
// http.ErrAbortHandler; the server goes on.
func TestPanics(t *testing.T) {
	addr, _, logs := start(t, &http.Server{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/panic":
			panic("boom")
		case "/abort":
			panic(http.ErrAbortHandler)
		}
		_, _ = io.WriteString(w, "ok")
	}))
	for _, p := range []string{"/panic", "/abort"} {
		_, br := raw(t, addr, "GET "+p+" HTTP/1.1\r\nHost: h\r\n\r\n")
		if _, err := http.ReadResponse(br, nil); err == nil {
			t.Fatalf("%s: got an answer", p)
		}
	}
	if _, got := readResp(t, func() *bufio.Reader { _, br := raw(t, addr, "GET / HTTP/1.1\r\nHost: h\r\n\r\n"); return br }(), "GET"); got != "ok" {
		t.Fatalf("after the panics: %q", got)
	}
	if l := logs.String(); strings.Count(l, "panic serving") != 1 || !strings.Contains(l, "boom") {
		t.Fatalf("log: %s", l)
	}
}

// Shutdown lets a request in flight finish, closes idle connections and
// stops accepting; Serve returns http.ErrServerClosed.
func TestShutdown(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(entered)
			<-release
		}
		_, _ = io.WriteString(w, "done")
	}), ReadHeaderTimeout: 5 * time.Second}
	s := New(srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()

	idle, idleBr := raw(t, addr, "GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	readResp(t, idleBr, "GET")
	_, slowBr := raw(t, addr, "GET /slow HTTP/1.1\r\nHost: h\r\n\r\n")
	<-entered

	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(context.Background()) }()
	_ = idle.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := idleBr.ReadByte(); err != io.EOF {
		t.Fatalf("idle connection: %v, want closed", err)
	}
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned (%v) with a request in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	resp, got := readResp(t, slowBr, "GET")
	if got != "done" || !resp.Close {
		t.Fatalf("in-flight request: %q, close %v", got, resp.Close)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Fatalf("Serve: %v", err)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatal("still accepting after Shutdown")
	}
}

// Shutdown gives up when its context ends; Close then ends the request's
// connection.
func TestShutdownDeadline(t *testing.T) {
	entered := make(chan struct{})
	addr, s, _ := start(t, &http.Server{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-r.Context().Done()
	}))
	_, br := raw(t, addr, "GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := s.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown: %v, want the deadline", err)
	}
	_ = s.Close()
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("the connection survived Close")
	}
}

// The idle timeout closes a connection that sends nothing more.
func TestIdleTimeout(t *testing.T) {
	addr, _, _ := start(t, &http.Server{IdleTimeout: 200 * time.Millisecond}, echo)
	_, br := raw(t, addr, postReq("x"))
	readResp(t, br, "POST")
	start := time.Now()
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("%v, want EOF", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("closed after %v", d)
	}
}

// A body read deadline set through http.ResponseController applies.
func TestReadDeadline(t *testing.T) {
	got := make(chan error, 1)
	addr, _, _ := start(t, &http.Server{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		_, err := io.ReadAll(r.Body)
		got <- err
	}))
	raw(t, addr, "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\nabc")
	select {
	case err := <-got:
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("%v, want a timeout", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the body read outlived its deadline")
	}
}

// A request with Connection: close is answered with it, and the
// connection ends after the answer; so does one whose handler asks for it.
func TestConnectionClose(t *testing.T) {
	addr, _, _ := start(t, &http.Server{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/bye" {
			w.Header().Set("Connection", "close")
		}
		_, _ = io.WriteString(w, r.URL.Path)
	}))
	for _, req := range []string{
		"GET /x HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\nGET /never HTTP/1.1\r\nHost: h\r\n\r\n",
		"GET /bye HTTP/1.1\r\nHost: h\r\n\r\nGET /never HTTP/1.1\r\nHost: h\r\n\r\n",
	} {
		_, br := raw(t, addr, req)
		resp, got := readResp(t, br, "GET")
		if !resp.Close || got == "/never" {
			t.Fatalf("answer %q, close %v", got, resp.Close)
		}
		if b, err := br.ReadByte(); err == nil {
			t.Fatalf("read %q after a closing answer", b)
		}
	}
}

// Client certificates are required as configured: the handshake here
// uses the server's TLS configuration as it is.
func TestMutualTLS(t *testing.T) {
	ca := testkit.NewCA(t)
	addr, _, _ := start(t, &http.Server{TLSConfig: &tls.Config{
		Certificates: []tls.Certificate{ca.Issue(t, "server")},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    ca.Pool,
		MinVersion:   tls.VersionTLS12,
	}}, echo)
	post := func(certs []tls.Certificate) error {
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs: ca.Pool, Certificates: certs, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"},
		}}}
		defer client.CloseIdleConnections()
		resp, err := client.Post("https://"+addr+"/x", "text/plain", strings.NewReader("m"))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.Header.Get("X-Path") != "fast" {
			return fmt.Errorf("served via %q", resp.Header.Get("X-Path"))
		}
		return nil
	}
	if err := post(nil); err == nil {
		t.Fatal("a client without a certificate was served")
	}
	if err := post([]tls.Certificate{ca.Issue(t, "client")}); err != nil {
		t.Fatalf("a client with a certificate: %v", err)
	}
}

// Plaintext stays plaintext on every new connection: net/http's own
// serving of the hand-offs fills in a TLS configuration of its own for
// HTTP/2, which the fast path must not take for the listener's.
func TestPlaintextConnections(t *testing.T) {
	addr, _, _ := start(t, &http.Server{}, echo)
	// A request net/http answers (HTTP/1.0 is handed off) shows that its
	// Serve has set itself up, TLS configuration included.
	_, br := raw(t, addr, "GET /old HTTP/1.0\r\n\r\n")
	if resp, got := readResp(t, br, "GET"); got != "GET /old " || resp.Header.Get("X-Path") != "http" {
		t.Fatalf("hand-off: %q via %s", got, resp.Header.Get("X-Path"))
	}
	for i := range 20 {
		_, br := raw(t, addr, postReq(fmt.Sprint(i)))
		if resp, got := readResp(t, br, "POST"); got != fmt.Sprint("POST /v1/chat ", i) || resp.Header.Get("X-Path") != "fast" {
			t.Fatalf("connection %d: %q via %s", i, got, resp.Header.Get("X-Path"))
		}
	}
}
