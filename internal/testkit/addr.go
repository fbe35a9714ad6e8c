package testkit

import (
	"net"
	"strconv"
	"testing"
)

// FreeAddr returns a 127.0.0.1 address with a port nobody listened on a
// moment ago, for a server the test cannot hand a listener to (a child
// process, a config file). Another process may take the port before the
// server binds it; the kernel hands out ephemeral ports in turn, so that is
// rare enough for tests.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// FreePort is FreeAddr's port.
func FreePort(t testing.TB) int {
	t.Helper()
	_, p, err := net.SplitHostPort(FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
