package testkit

import (
	"net"
	"testing"
)

func TestFreeAddrIsListenable(t *testing.T) {
	addr := FreeAddr(t)
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host != "127.0.0.1" {
		t.Fatalf("FreeAddr = %q (%v), want a 127.0.0.1 host:port", addr, err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on %s: %v", addr, err)
	}
	_ = ln.Close()
}
