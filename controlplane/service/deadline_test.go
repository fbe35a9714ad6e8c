package service

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A stalled request body is cut off at the deadline (and its buffer
// released), while a complete one leaves a slow handler alone.
func TestBodyReadDeadline(t *testing.T) {
	type result struct {
		n   int
		err error
	}
	got := make(chan result, 2)
	h := BodyReadDeadline(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		got <- result{len(b), err}
		if err != nil {
			w.WriteHeader(http.StatusRequestTimeout)
			return
		}
		// Longer than the deadline: a deadline still running after the
		// body would break this answer.
		time.Sleep(400 * time.Millisecond)
		_, _ = io.WriteString(w, "done")
	}), 200*time.Millisecond)
	srv := httptest.NewServer(h)
	defer srv.Close()

	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprint(conn, "POST /x HTTP/1.1\r\nHost: cp\r\nContent-Length: 1000000\r\n\r\nonly a little")
	select {
	case r := <-got:
		var ne net.Error
		if r.err == nil || !(errors.As(r.err, &ne) && ne.Timeout()) {
			t.Fatalf("stalled body read returned %d bytes, err %v; want a timeout", r.n, r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a stalled body was still being waited for after 5s with a 200ms deadline")
	}

	resp, err := http.Post(srv.URL+"/x", "application/octet-stream", strings.NewReader("complete body"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(bufio.NewReader(resp.Body))
	if resp.StatusCode != http.StatusOK || string(b) != "done" {
		t.Fatalf("complete body, slow handler: %d %q", resp.StatusCode, b)
	}
	if r := <-got; r.err != nil || r.n != len("complete body") {
		t.Fatalf("complete body read: %+v", r)
	}
}
