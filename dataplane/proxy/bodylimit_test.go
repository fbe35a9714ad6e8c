package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cartrouter/cart/dataplane/proxy"
)

// rawChunkedPost sends body with Transfer-Encoding: chunked (so there is
// no Content-Length to check up front) in chunks of chunk bytes, and reads
// the response.
func rawChunkedPost(t *testing.T, front, body string, chunk int) (*http.Response, string) {
	t.Helper()
	conn := dialFront(t, front, 10*time.Second)
	var sb strings.Builder
	sb.WriteString("POST /v1/chat/completions HTTP/1.1\r\nHost: cart\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
	for rest := body; len(rest) > 0; {
		n := min(chunk, len(rest))
		fmt.Fprintf(&sb, "%x\r\n%s\r\n", n, rest[:n])
		rest = rest[n:]
	}
	sb.WriteString("0\r\n\r\n")
	// The request fits the socket buffers, so writing it all first cannot
	// deadlock with a server that answers before reading everything.
	if _, err := io.WriteString(conn, sb.String()); err != nil {
		t.Fatal(err)
	}
	return readResponse(t, conn)
}

// The body limit holds for chunked bodies, which carry no Content-Length:
// 413 in the OpenAI error shape, nothing forwarded. A chunked body under
// the limit goes through.
func TestBodyLimitChunked(t *testing.T) {
	a := newBackend(t, "a")
	r := newRig(t, []string{a.URL}, withOptions(func(o *proxy.Options) { o.MaxBodyBytes = 4096 }))

	resp, body := rawChunkedPost(t, r.front.URL, chatBody(longText("x", 16000), "q", false), 1000)
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d body %s, want 413", resp.StatusCode, body)
	}
	assertOpenAIError(t, body, "max_body_bytes")
	if a.hits.Load() != 0 {
		t.Fatal("an oversized chunked body reached the replica")
	}

	resp, body = rawChunkedPost(t, r.front.URL, chatBody(longText("x", 2000), "q", false), 500)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "hi from a") {
		t.Fatalf("chunked body under the limit: %d %s", resp.StatusCode, body)
	}
	if v := counterValue(t, r, "cart_requests_total", `status="4xx"`); v != 1 {
		t.Fatalf("cart_requests_total{4xx} = %v, want 1 (the 413)", v)
	}
	r.waitLoadZero()
}

// A body that is not coming is refused at once, and nothing reaches the
// replica: one that trickles in slower than the body read timeout gets 408
// instead of holding a connection and a buffer forever, and one declared
// larger than the limit gets 413 without waiting for it.
func TestBodyNotComingRefusedEarly(t *testing.T) {
	body := chatBody("s", "q", false)
	cases := []struct {
		name    string
		opt     func(*proxy.Options)
		request string
		status  int
		message string
	}{
		{"slow body", func(o *proxy.Options) { o.BodyReadTimeout = 300 * time.Millisecond },
			fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(body), body[:10]), http.StatusRequestTimeout, "not received"},
		{"declared oversized", func(o *proxy.Options) { o.MaxBodyBytes = 4096 },
			"Content-Length: 100000\r\n\r\n{\"model\":", http.StatusRequestEntityTooLarge, "max_body_bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := newBackend(t, "a")
			r := newRig(t, []string{a.URL}, withOptions(tc.opt))
			conn := dialFront(t, r.front.URL, 10*time.Second)
			fmt.Fprint(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: cart\r\n"+tc.request)
			start := time.Now()
			resp, got := readResponse(t, conn)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d body %s, want %d", resp.StatusCode, got, tc.status)
			}
			assertOpenAIError(t, got, tc.message)
			if d := time.Since(start); d > 3*time.Second {
				t.Fatalf("refused after %v", d)
			}
			if a.hits.Load() != 0 {
				t.Fatal("a partial body reached the replica")
			}
		})
	}
}
