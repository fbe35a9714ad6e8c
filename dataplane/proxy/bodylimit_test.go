package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
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
	conn, err := net.Dial("tcp", strings.TrimPrefix(front, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
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
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
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

// A body that trickles in slower than the body read timeout is refused
// with 408 instead of holding a connection and a buffer forever.
func TestSlowBodyTimesOut(t *testing.T) {
	a := newBackend(t, "a")
	r := newRig(t, []string{a.URL}, withOptions(func(o *proxy.Options) { o.BodyReadTimeout = 300 * time.Millisecond }))
	conn, err := net.Dial("tcp", strings.TrimPrefix(r.front.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	body := chatBody("s", "q", false)
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: cart\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:10])
	start := time.Now()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("status %d body %s, want 408", resp.StatusCode, got)
	}
	assertOpenAIError(t, string(got), "not received")
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("refused after %v with a 300ms body timeout", d)
	}
	if a.hits.Load() != 0 {
		t.Fatal("a partial body reached the replica")
	}
}

// A body declared larger than the limit is refused at once, even when the
// client never sends it.
func TestDeclaredOversizedBodyRefusedWithoutWaitingForIt(t *testing.T) {
	a := newBackend(t, "a")
	r := newRig(t, []string{a.URL}, withOptions(func(o *proxy.Options) { o.MaxBodyBytes = 4096 }))
	conn, err := net.Dial("tcp", strings.TrimPrefix(r.front.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprint(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: cart\r\nContent-Length: 100000\r\n\r\n{\"model\":")
	start := time.Now()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer after %v: %v", time.Since(start), err)
	}
	got, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d body %s, want 413", resp.StatusCode, got)
	}
	assertOpenAIError(t, string(got), "max_body_bytes")
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("refused after %v", d)
	}
}
