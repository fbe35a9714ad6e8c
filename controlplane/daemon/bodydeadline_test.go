package daemon_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"
)

// A Route body announced large and never finished is cut off at
// controlplane.api_body_read_timeout_secs: the node answers and closes
// instead of holding the connection and its buffer.
func TestAPIStalledBodyIsCutOff(t *testing.T) {
	p := startNodes(t, 1, nodeOpts{workers: []string{"http://127.0.0.1:1"}, cp: "  api_body_read_timeout_secs: 0.3\n"})[0]

	conn, err := net.Dial("tcp", p.api)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	// Most of a large body, then nothing: the node must not wait for (or
	// try to drain) the rest.
	fmt.Fprint(conn, "POST /cart.v1.RouterService/Route HTTP/1.1\r\nHost: cp\r\nContent-Type: application/proto\r\nContent-Length: 3000000\r\n\r\n\x0a\x01m\x12\xb8\x8d\xb7\x01")
	go func() { _, _ = conn.Write(make([]byte, 2900000)) }()
	start := time.Now()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer %v after sending part of a body (read timeout 0.3 s): %v", time.Since(start), err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		t.Fatalf("a truncated Route body was answered 200")
	}
	// And the connection is closed: the bytes that follow would be the
	// rest of the body, not a next request.
	if !resp.Close {
		t.Fatal("the connection of a cut-off body stays open")
	}
}
