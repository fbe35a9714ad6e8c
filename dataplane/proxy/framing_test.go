package proxy_test

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"
)

// pipelined writes raw requests on one connection and reads the answers
// until the server closes it or stops answering.
func pipelined(t *testing.T, front, raw string, want int) []*http.Response {
	t.Helper()
	conn := dialFront(t, front, 5*time.Second)
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	var out []*http.Response
	for len(out) < want {
		resp, err := http.ReadResponse(br, nil)
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return out
		}
		if err != nil {
			t.Fatalf("after %d answers: %v", len(out), err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		out = append(out, resp)
	}
	return out
}

// A request with both Content-Length and Transfer-Encoding is answered
// and its connection closed (RFC 9112 section 6.3): the request
// pipelined behind it, which a front proxy may frame differently, is
// never served.
func TestContentLengthWithTransferEncodingClosesConnection(t *testing.T) {
	a := newBackend(t, "a")
	r := newRig(t, []string{a.URL})
	smuggle := "POST /v1/chat/completions HTTP/1.1\r\nHost: cart\r\nContent-Type: application/json\r\n" +
		"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" +
		"GET /health HTTP/1.1\r\nHost: cart\r\n\r\n"
	got := pipelined(t, r.front.URL, smuggle, 2)
	if len(got) != 1 {
		t.Fatalf("%d answers on the connection, want 1 and a close", len(got))
	}
	if got[0].StatusCode != http.StatusBadRequest || !got[0].Close {
		t.Fatalf("first answer %d, close %v; want 400 and Connection: close", got[0].StatusCode, got[0].Close)
	}

	// Requests framed by Content-Length alone keep their connection.
	plain := "GET /health HTTP/1.1\r\nHost: cart\r\n\r\nGET /health HTTP/1.1\r\nHost: cart\r\n\r\n"
	if got := pipelined(t, r.front.URL, plain, 2); len(got) != 2 {
		t.Fatalf("%d answers to two pipelined plain requests, want 2", len(got))
	}
}
