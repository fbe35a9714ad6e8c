package testkit

import (
	"net"
	"testing"
)

func TestFreeAddrIsALoopbackPortThatCanBeBound(t *testing.T) {
	addr := FreeAddr(t)
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host != "127.0.0.1" || port == "0" {
		t.Fatalf("FreeAddr = %q (%v)", addr, err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("FreeAddr's %s cannot be bound: %v", addr, err)
	}
	_ = ln.Close()
	if p := FreePort(t); p <= 0 || p > 65535 {
		t.Fatalf("FreePort = %d", p)
	}
}
