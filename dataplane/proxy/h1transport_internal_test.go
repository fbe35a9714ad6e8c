package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// rawWorker accepts one connection on 127.0.0.1, reads one request,
// writes answer and closes the connection.
func rawWorker(t *testing.T, answer string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		_, _ = io.WriteString(c, answer)
	}()
	return "http://" + ln.Addr().String()
}

// Response headers past the limit fail the exchange instead of growing a
// buffer without end.
func TestH1TransportHeaderLimit(t *testing.T) {
	huge := "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("a", 64<<10) + "\r\nContent-Length: 0\r\n\r\n"
	tr := newH1Transport(time.Second, 5*time.Second, http.DefaultTransport)
	tr.maxHeaderBytes = 16 << 10
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, rawWorker(t, huge)+"/x", nil)
	resp, err := tr.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
		t.Fatal("64 KiB of headers accepted with a limit of 16 KiB")
	}
	if !errors.Is(err, errHeadersTooLarge) {
		t.Fatalf("error %v, want the header limit", err)
	}
	// Within the limit, the same answer is read.
	tr.maxHeaderBytes = 1 << 20
	req, _ = http.NewRequestWithContext(context.Background(), http.MethodGet, rawWorker(t, huge)+"/x", nil)
	resp, err = tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(resp.Header.Get("X-Big")) != 64<<10 {
		t.Fatal("header not read whole")
	}
}

// More interim responses than net/http's Transport accepts fail the
// exchange.
func TestH1TransportTooManyInterimResponses(t *testing.T) {
	answer := strings.Repeat("HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n", max1xx+1) + "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
	tr := newH1Transport(time.Second, 5*time.Second, http.DefaultTransport)
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, rawWorker(t, answer)+"/x", nil)
	if resp, err := tr.RoundTrip(req); err == nil {
		resp.Body.Close()
		t.Fatalf("%d interim responses accepted", max1xx+1)
	}
	answer = strings.Repeat("HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n", max1xx) + "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
	req, _ = http.NewRequestWithContext(context.Background(), http.MethodGet, rawWorker(t, answer)+"/x", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

type countingRT struct{ n int }

func (c *countingRT) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n++
	if r.Body != nil {
		_ = r.Body.Close()
	}
	return nil, errors.New("counted")
}

// What this transport does not handle goes to the other one: https, a
// body of unknown length, a body too large to write before reading.
func TestH1TransportHandsOff(t *testing.T) {
	other := &countingRT{}
	tr := newH1Transport(time.Second, time.Second, other)
	for _, tc := range []struct {
		url    string
		length int64
	}{
		{"https://127.0.0.1:1/x", 0},
		{"http://127.0.0.1:1/x", -1},
		{"http://127.0.0.1:1/x", maxH1Body + 1},
	} {
		req, _ := http.NewRequest(http.MethodPost, tc.url, strings.NewReader("x"))
		req.ContentLength = tc.length
		before := other.n
		_, _ = tr.RoundTrip(req)
		if other.n != before+1 {
			t.Errorf("%s with length %d not handed to the other transport", tc.url, tc.length)
		}
	}
	// A small plain-http request stays here (and fails to connect).
	req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:1/x", strings.NewReader("x"))
	before := other.n
	if _, err := tr.RoundTrip(req); err == nil || other.n != before {
		t.Errorf("small http request: err %v, handed off %v", err, other.n != before)
	}
}
