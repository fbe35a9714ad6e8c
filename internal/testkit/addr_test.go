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

// FreeAddr's ports come from below the kernel's ephemeral range, which
// outgoing connections take their source ports from.
func TestFreeAddrAvoidsTheEphemeralRange(t *testing.T) {
	lo, ok := ephemeralLow()
	if !ok || lo <= minTestPort+1000 {
		t.Skip("no room below the ephemeral range here")
	}
	for range 20 {
		p := FreePort(t)
		if p < minTestPort || p >= lo {
			t.Fatalf("FreePort = %d, want %d..%d", p, minTestPort, lo-1)
		}
	}
}
