package proxy_test

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cartrouter/cart/dataplane/proxy"
)

// countingConn counts the writes made on a connection.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// A small request goes to the worker in one write, headers and body
// together, not headers first and the body after.
func TestSmallRequestOneUpstreamWrite(t *testing.T) {
	b := newBackend(t, "a")
	var writes atomic.Int64
	tr := proxy.NewTransport(time.Second, 10*time.Second)
	d := &net.Dialer{Timeout: time.Second}
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, writes: &writes}, nil
	}
	t.Cleanup(tr.CloseIdleConnections)
	r := newRig(t, []string{b.URL}, withOptions(func(o *proxy.Options) { o.Transport = tr }))
	for i := range 3 {
		before := writes.Load()
		resp := r.post("/v1/chat/completions", chatBody("system", longText("u", 1000), false))
		if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		if n := writes.Load() - before; n != 1 {
			t.Fatalf("request %d: %d writes to the worker, want 1", i, n)
		}
	}
	r.waitLoadZero()
}
