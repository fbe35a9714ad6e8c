package testkit

import (
	"net"
	"testing"
)

// FreeAddr is a loopback host:port that was free a moment ago, for a
// server the test configures by address rather than by listener. Another
// process may take it in between; tests that can pass a listener should.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
