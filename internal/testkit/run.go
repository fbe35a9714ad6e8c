package testkit

import (
	"context"
	"net"
	"testing"
)

// RunOnLoopback runs a server's Run(ctx, ln) on a fresh 127.0.0.1 listener
// until the test ends, then stops it (the context ends) and fails the test
// if Run returned an error. It returns the listener's address.
func RunOnLoopback(t testing.TB, run func(context.Context, net.Listener) error) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server on %s: %v", ln.Addr(), err)
		}
	})
	return ln.Addr().String()
}
