package cpclient

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/cartrouter/cart/internal/testkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// okServer is an h2c server answering "ok", and a client of this package
// that reaches it through a Blackhole.
func okServer(t *testing.T, h http.HandlerFunc) (*testkit.Blackhole, *http.Client, string) {
	t.Helper()
	if h == nil {
		h = func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }
	}
	srv := testkit.H2CServer(h)
	srv.Start()
	t.Cleanup(srv.Close)
	hole := testkit.NewBlackhole(t, srv.Listener.Addr().String())
	c := NewWithTLS(nil)
	t.Cleanup(c.CloseIdleConnections)
	return hole, c, "http://" + hole.Addr() + "/"
}

func get(ctx context.Context, c *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.ProtoMajor != 2 {
		return errors.New("not HTTP/2: " + resp.Proto)
	}
	_, err = io.ReadAll(resp.Body)
	return err
}

// A connection that stops delivering without closing (a partition) is
// found dead by the HTTP/2 health check and closed, so the call on it
// fails long before its own deadline, and the next one dials afresh and
// works as soon as the network does, although the old connection would
// stay silent (TCP's backed-off retransmission) for an hour.
func TestPingClosesAConnectionThatStopsDelivering(t *testing.T) {
	hole, c, url := okServer(t, nil)
	ctx := context.Background()
	if err := get(ctx, c, url); err != nil {
		t.Fatal(err)
	}
	hole.Cut()
	// The deadline is far above PingAfterIdle+PingTimeout: a call that
	// hits it was left on a dead connection.
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err := get(dctx, c, url)
	cancel()
	if err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a call on the partitioned connection ended with %v; want the connection closed by the health check before the call's 10 s deadline", err)
	}
	hole.Heal(time.Hour)
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := get(hctx, c, url); err != nil {
		t.Fatalf("after the heal: %v", err)
	}
	if n := hole.Accepted(); n != 2 {
		t.Fatalf("%d connections dialled, want 2 (the dead one and a fresh one)", n)
	}
}

// DropConns closes the connections to one node, a call in flight on them
// included, and the next call dials a new one; other nodes' connections
// stay.
func TestDropConnsForcesAFreshDial(t *testing.T) {
	release, arrived := make(chan struct{}), make(chan struct{}, 1)
	hole, c, url := okServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			arrived <- struct{}{}
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		_, _ = io.WriteString(w, "ok")
	})
	defer close(release)
	_, _, other := okServer(t, nil)
	ctx := context.Background()
	if err := get(ctx, c, url); err != nil {
		t.Fatal(err)
	}
	if err := get(ctx, c, other); err != nil {
		t.Fatal(err)
	}
	held := make(chan error, 1)
	go func() { held <- get(ctx, c, url+"hold") }()
	tr := c.Transport.(*Transport)
	<-arrived // in flight, on the one HTTP/2 connection to the node
	if n := tr.DropConns(url); n != 1 {
		t.Fatalf("DropConns closed %d connections, want 1", n)
	}
	select {
	case err := <-held:
		if err == nil {
			t.Fatal("the call in flight on a dropped connection succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call in flight on a dropped connection did not end")
	}
	if err := get(ctx, c, url); err != nil {
		t.Fatal(err)
	}
	if n := hole.Accepted(); n != 2 {
		t.Fatalf("%d connections to the dropped node, want 2", n)
	}
	if n := tr.DropConns("http://127.0.0.1"); n != 0 {
		t.Fatalf("DropConns of a node never called closed %d connections", n)
	}
	if n := tr.DropConns("::not a url"); n != 0 {
		t.Fatalf("DropConns of a bad URL closed %d connections", n)
	}
}
