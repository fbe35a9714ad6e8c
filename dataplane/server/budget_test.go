package server_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
)

// The proxy.* budgets reach the proxy from the configuration: the item
// cap, the budget of body bytes in flight and the body read timeout.
func TestBodyBudgetsFromConfig(t *testing.T) {
	rp := newReplica(t, "a")
	a := newAllInOne(t, configFiles(t, workersYAML(rp.URL)+
		"proxy:\n  max_body_bytes: 3000\n  max_inflight_body_bytes: 4096\n  max_messages: 3\n  body_read_timeout_secs: 0.5\n"))
	base := serveHTTP(t, a)

	msgs := `{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"user","content":"c"},{"role":"user","content":"d"}]}`
	if status, _, body := chat(t, base, msgs); status != http.StatusBadRequest || !strings.Contains(body, "max_messages") {
		t.Fatalf("4 messages with max_messages 3: %d %s", status, body)
	}

	stall := func(n int) net.Conn {
		conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: cart\r\nContent-Length: %d\r\n\r\n{", n)
		return conn
	}
	first := stall(2000)
	testkit.WaitFor(t, 10*time.Second, "the stalled body's reservation", func() bool { n, _ := a.Proxy.InflightBodyBytes(); return n == 2000 })
	resp, err := http.ReadResponse(bufio.NewReader(stall(2500)), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("2000 + 2500 bytes with max_inflight_body_bytes 4096: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	// The stalled upload runs out of time and gives its bytes back.
	resp, err = http.ReadResponse(bufio.NewReader(first), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("stalled body after body_read_timeout_secs: %d, want 408", resp.StatusCode)
	}
	testkit.WaitFor(t, 10*time.Second, "the reservation's release", func() bool { n, _ := a.Proxy.InflightBodyBytes(); return n == 0 })
}
