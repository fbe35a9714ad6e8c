package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// seqWorker serves requests on 127.0.0.1 with answer(i) for the i-th
// request over all connections (nil: never answer, hold until the test
// ends), and counts the connections it accepted.
type seqWorker struct {
	url    string
	opened atomic.Int32
	n      atomic.Int32
	hold   chan struct{} // an empty part in an answer waits for its close
}

func newSeqWorker(t *testing.T, answer func(i int) []string) *seqWorker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w := &seqWorker{url: "http://" + ln.Addr().String(), hold: make(chan struct{})}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		close(quit)
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			w.opened.Add(1)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					parts := answer(int(w.n.Add(1)) - 1)
					if parts == nil {
						<-quit
						return
					}
					for _, p := range parts {
						if p == closeConn {
							return
						}
						if p == "" { // a pause until the test releases it
							select {
							case <-w.hold:
							case <-quit:
								return
							}
							continue
						}
						if _, err := io.WriteString(c, p); err != nil {
							return
						}
					}
				}
			})
		}
	})
	return w
}

func roundTrip(t *testing.T, tr *h1Transport, url string) (string, error) {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, url+"/v1/x", strings.NewReader("{}"))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// closeConn, as a part of an answer, closes the connection there.
const closeConn = "\x00close"

const small = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

// A worker that closes the connection with nothing said back, on a
// connection reused without a check moments after its last answer: a
// request that may be sent twice goes again, once, on a new connection.
func TestH1ClosedBeforeAnswerRetried(t *testing.T) {
	w := newSeqWorker(t, func(i int) []string {
		if i == 1 {
			return []string{closeConn}
		}
		return []string{small}
	})
	tr := newH1Transport(time.Second, 5*time.Second, http.DefaultTransport)
	for i := range 2 {
		if b, err := roundTrip(t, tr, w.url); err != nil || b != "ok" {
			t.Fatalf("request %d: %q %v", i, b, err)
		}
	}
	if n, c := w.n.Load(), w.opened.Load(); n != 3 || c != 2 {
		t.Fatalf("%d requests on %d connections, want 3 on 2", n, c)
	}
}

// A request that must not be sent twice is not resent, and one that got
// part of an answer back is not either: the worker saw it.
func TestH1ClosedBeforeAnswerNotRetried(t *testing.T) {
	for _, tc := range []struct {
		name     string
		partial  string
		noResend bool
	}{
		{name: "no resend", noResend: true},
		{name: "partial answer", partial: "HTTP/1.1 200 OK\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newSeqWorker(t, func(i int) []string {
				if i == 1 {
					return []string{tc.partial, closeConn}[boolIndex(tc.partial == ""):]
				}
				return []string{small}
			})
			tr := newH1Transport(time.Second, 5*time.Second, http.DefaultTransport)
			if b, err := roundTrip(t, tr, w.url); err != nil || b != "ok" {
				t.Fatalf("%q %v", b, err)
			}
			ctx := context.Background()
			if tc.noResend {
				ctx = context.WithValue(ctx, noResendKey{}, true)
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, w.url+"/v1/x", strings.NewReader("{}"))
			if resp, err := tr.RoundTrip(req); err == nil {
				resp.Body.Close()
				t.Fatal("the request was sent again")
			}
			if n := w.n.Load(); n != 2 {
				t.Fatalf("the worker got %d requests, want 2", n)
			}
		})
	}
}

func boolIndex(b bool) int {
	if b {
		return 1
	}
	return 0
}
