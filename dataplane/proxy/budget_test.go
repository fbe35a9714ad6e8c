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
	"github.com/cartrouter/cart/internal/testkit"
)

// stalledPost opens a connection, announces a body of size bytes and sends
// only its first bytes, like a slow or malicious uploader. The caller
// finishes or abandons it.
func stalledPost(t *testing.T, front string, body string) net.Conn {
	t.Helper()
	conn := dialFront(t, front, 10*time.Second)
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: cart\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:100])
	return conn
}

// The budget of body bytes in flight holds against stalled uploads: a
// declared length that does not fit is refused with 503 and Retry-After
// before a byte of it is read, a chunked body is refused as soon as it
// stops fitting, requests that fit still go through, and the reservation
// never exceeds the limit.
func TestBodyBudgetBoundsBytesInFlight(t *testing.T) {
	a := newBackend(t, "a")
	const limit = 64 << 10
	r := newRig(t, []string{a.URL}, withOptions(func(o *proxy.Options) {
		o.MaxBodyBytes = 40 << 10
		o.MaxInflightBodyBytes = limit
	}))
	big := chatBody(longText("s", 38<<10), "q", false)
	stalled := stalledPost(t, r.front.URL, big)
	testkit.WaitFor(t, 5*time.Second, "in-flight body bytes == int64(len(big))", func() bool { n, _ := r.proxy.InflightBodyBytes(); return n == int64(len(big)) })

	// Declared length over what is left: refused without reading.
	conn := stalledPost(t, r.front.URL, chatBody(longText("t", 30<<10), "q", false))
	resp, body := readResponse(t, conn)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("over-budget declared body: status %d, Retry-After %q, body %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	assertOpenAIError(t, body, "max_inflight_body_bytes")
	if !resp.Close {
		t.Fatal("the connection of a refused upload stays open: its unread body would be drained")
	}

	// Chunked: no length up front, refused while it arrives.
	resp, body = rawChunkedPost(t, r.front.URL, chatBody(longText("c", 30<<10), "q", false), 4096)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("over-budget chunked body: status %d body %s", resp.StatusCode, body)
	}
	assertOpenAIError(t, body, "max_inflight_body_bytes")

	// What fits goes through, stalled neighbour or not.
	if resp := r.post("/v1/chat/completions", chatBody("small", "q", false)); resp.StatusCode != http.StatusOK {
		t.Fatalf("a small request next to a stalled one: %d %s", resp.StatusCode, readAll(t, resp))
	} else {
		readAll(t, resp)
	}

	if _, err := io.WriteString(stalled, big[100:]); err != nil {
		t.Fatal(err)
	}
	if resp, body := readResponse(t, stalled); resp.StatusCode != http.StatusOK {
		t.Fatalf("the stalled request, once complete: %d %s", resp.StatusCode, body)
	}
	testkit.WaitFor(t, 5*time.Second, "in-flight body bytes == 0", func() bool { n, _ := r.proxy.InflightBodyBytes(); return n == 0 })
	if _, peak := r.proxy.InflightBodyBytes(); peak > limit || peak < int64(len(big)) {
		t.Fatalf("peak reservation %d, want between %d and the limit %d", peak, len(big), limit)
	}
	if a.hits.Load() != 2 {
		t.Fatalf("replica saw %d requests, want the 2 accepted ones", a.hits.Load())
	}
	r.waitLoadZero()
}

// Once the answer has started, the request body is no longer needed (no
// retry can follow): a long stream gives its bytes back to the budget
// instead of holding them until it ends.
func TestBodyBudgetReleasedWhenAnswerStarts(t *testing.T) {
	a := newBackend(t, "a")
	release := make(chan struct{})
	a.set(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		<-release
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
	r := newRig(t, []string{a.URL}, withOptions(func(o *proxy.Options) { o.MaxInflightBodyBytes = 1 << 20 }))
	resp := r.post("/v1/chat/completions", chatBody(longText("s", 20000), "q", true))
	defer resp.Body.Close()
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 5*time.Second, "in-flight body bytes == 0", func() bool { n, _ := r.proxy.InflightBodyBytes(); return n == 0 })
	close(release)
	readAll(t, resp)
	r.waitLoadZero()
}

// A request with more array items than the cap is refused before it is
// decoded; token ids of a completions prompt do not count.
func TestTooManyItemsRefused(t *testing.T) {
	a := newBackend(t, "a")
	r := newRig(t, []string{a.URL}, withOptions(func(o *proxy.Options) { o.MaxItems = 100 }))
	msgs := func(n int) string {
		return `{"model":"m","messages":[` + strings.TrimSuffix(strings.Repeat(`{"role":"user","content":"hi"},`, n), ",") + `]}`
	}
	resp := r.post("/v1/chat/completions", msgs(101))
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("101 messages with a cap of 100: %d %s", resp.StatusCode, body)
	}
	assertOpenAIError(t, body, "max_messages")
	if a.hits.Load() != 0 {
		t.Fatal("a request over the item cap reached the replica")
	}
	// Parts count as much as messages.
	parts := `{"model":"m","messages":[{"role":"user","content":[` + strings.TrimSuffix(strings.Repeat(`{"type":"text","text":"x"},`, 100), ",") + `]}]}`
	if resp := r.post("/v1/chat/completions", parts); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("1 message of 100 parts with a cap of 100: %d %s", resp.StatusCode, readAll(t, resp))
	} else {
		readAll(t, resp)
	}
	if resp := r.post("/v1/chat/completions", msgs(100)); resp.StatusCode != http.StatusOK {
		t.Fatalf("100 messages with a cap of 100: %d %s", resp.StatusCode, readAll(t, resp))
	} else {
		readAll(t, resp)
	}
	ids := strings.TrimSuffix(strings.Repeat("17,", 5000), ",")
	if resp := r.post("/v1/completions", `{"model":"m","prompt":[`+ids+`]}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("5000 token ids with an item cap of 100: %d %s", resp.StatusCode, readAll(t, resp))
	} else {
		readAll(t, resp)
	}
	r.waitLoadZero()
}
