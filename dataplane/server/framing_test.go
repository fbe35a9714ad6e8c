package server_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// exchange writes raw on a new connection to the client listener at base
// and reads every answer until the server closes the connection.
func exchange(t *testing.T, base, raw string) []*http.Response {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	var out []*http.Response
	for {
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		switch {
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return out
		case err != nil:
			t.Fatalf("after %d answers: %v", len(out), err)
		}
		if resp.StatusCode == http.StatusContinue {
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(strings.NewReader(string(body)))
		out = append(out, resp)
	}
}

// The client listener is Go's net/http alone, in front of the proxy: a
// request whose framing two parsers could read differently is refused, or
// read as RFC 9112 says (chunked wins over a length) and its connection
// closed after the answer, so the request pipelined behind it (a smuggled
// GET of /v1/models here) is never served; requests framed plainly reach
// the engine whole.
func TestClientListenerFraming(t *testing.T) {
	rep := newReplica(t, "w")
	base := runAllInOne(t, newAllInOne(t, configFiles(t, workersYAML(rep.URL))))
	body := chatBody("system", "hello", false, 1)
	// It asks for the close itself, so that a kept connection ends too.
	const smuggled = "GET /v1/models HTTP/1.1\r\nHost: cart\r\nConnection: close\r\n\r\n"
	post := func(headers, payload string) string {
		return "POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json\r\n" + headers + "\r\n" + payload
	}
	length := func(headers string) string {
		return post(fmt.Sprintf("%sContent-Length: %d\r\n", headers, len(body)), body)
	}
	chunked := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(body), body)

	const (
		refused = iota // an error status, then the connection closed
		closed         // the chat answered, then the connection closed
		kept           // the chat answered, then the pipelined request
	)
	for name, tc := range map[string]struct {
		raw  string
		want int
	}{
		"two lengths":                    {post(fmt.Sprintf("Host: cart\r\nContent-Length: %d\r\nContent-Length: 4\r\n", len(body)), body), refused},
		"length list":                    {post(fmt.Sprintf("Host: cart\r\nContent-Length: %d, 4\r\n", len(body)), body), refused},
		"signed length":                  {post(fmt.Sprintf("Host: cart\r\nContent-Length: +%d\r\n", len(body)), body), refused},
		"negative length":                {post("Host: cart\r\nContent-Length: -1\r\n", body), refused},
		"space before colon":             {post(fmt.Sprintf("Host: cart\r\nContent-Length : %d\r\n", len(body)), body), refused},
		"chunked twice":                  {post("Host: cart\r\nTransfer-Encoding: chunked, chunked\r\n", chunked), refused},
		"identity then chunked":          {post("Host: cart\r\nTransfer-Encoding: identity, chunked\r\n", chunked), refused},
		"unknown coding":                 {post("Host: cart\r\nTransfer-Encoding: xchunked\r\n", chunked), refused},
		"chunk size with junk":           {post("Host: cart\r\nTransfer-Encoding: chunked\r\n", "4x\r\nabcd\r\n0\r\n\r\n"), refused},
		"chunk size overflow":            {post("Host: cart\r\nTransfer-Encoding: chunked\r\n", "10000000000000001\r\nab\r\n0\r\n\r\n"), refused},
		"no host":                        {length(""), refused},
		"two hosts":                      {length("Host: cart\r\nHost: other\r\n"), refused},
		"control byte in a header value": {length("Host: cart\r\nX-A: a\x00b\r\n"), refused},
		"space in the method":            {"PO ST /v1/chat/completions HTTP/1.1\r\nHost: cart\r\n\r\n", refused},
		"unknown version":                {"GET /v1/models HTTP/1.2x\r\nHost: cart\r\n\r\n", refused},

		"length and chunked":       {post("Host: cart\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n", chunked), closed},
		"folded transfer-encoding": {post("Host: cart\r\nTransfer-Encoding:\r\n chunked\r\n", chunked), closed},
		"chunked":                  {post("Host: cart\r\nTransfer-Encoding: chunked\r\n", chunked), closed},

		"content-length":      {length("Host: cart\r\n"), kept},
		"expect 100":          {length("Host: cart\r\nExpect: 100-continue\r\n"), kept},
		"http/1.0 keep-alive": {strings.Replace(length("Host: cart\r\nConnection: keep-alive\r\n"), "HTTP/1.1", "HTTP/1.0", 1), kept},
	} {
		t.Run(name, func(t *testing.T) {
			got := exchange(t, base, tc.raw+smuggled)
			if len(got) == 0 {
				t.Fatal("no answer")
			}
			b, _ := io.ReadAll(got[0].Body)
			switch tc.want {
			case refused:
				if got[0].StatusCode < 400 {
					t.Fatalf("answer %d: %s; want a refusal", got[0].StatusCode, b)
				}
			default:
				if got[0].StatusCode != http.StatusOK || !strings.Contains(string(b), "chat.completion") {
					t.Fatalf("chat answer %d: %s", got[0].StatusCode, b)
				}
			}
			if tc.want == kept {
				if len(got) != 2 || got[1].StatusCode != http.StatusOK {
					t.Fatalf("%d answers, want the chat answer and the pipelined one", len(got))
				}
				return
			}
			if len(got) != 1 || !got[0].Close {
				t.Fatalf("%d answers, close %v; want 1 and Connection: close", len(got), got[0].Close)
			}
		})
	}
}
