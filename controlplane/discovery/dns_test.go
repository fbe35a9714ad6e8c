package discovery

import (
	"context"
	"net"
	"reflect"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/cartrouter/cart/controlplane/discovery/dnstest"
)

func resolver(t *testing.T, o DNSOptions) *DNSResolver {
	t.Helper()
	r, err := NewDNSResolver(o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// wantResolved resolves once and checks the answer's endpoints and TTL.
func wantResolved(t *testing.T, r *DNSResolver, want []string, ttl time.Duration) {
	t.Helper()
	a := r.Resolve(context.Background())
	if a.Err != nil {
		t.Fatal(a.Err)
	}
	if !reflect.DeepEqual(a.Endpoints, want) {
		t.Fatalf("endpoints = %v, want %v", a.Endpoints, want)
	}
	if a.TTL != ttl {
		t.Fatalf("TTL = %v, want %v", a.TTL, ttl)
	}
}

func TestDNSResolverARecords(t *testing.T) {
	s := dnstest.Start(t)
	s.Set(t, "sim. 7 IN A 127.0.0.2", "sim. 3 IN A 127.0.0.1", "sim. 9 IN AAAA ::1", "other. 1 IN A 10.0.0.1")
	r := resolver(t, DNSOptions{Name: "sim", Port: 8000, Server: s.Addr, Timeout: time.Second})
	// The TTL is the smallest of the records'.
	wantResolved(t, r, []string{"http://127.0.0.1:8000", "http://127.0.0.2:8000", "http://[::1]:8000"}, 3*time.Second)
}

func TestDNSResolverSRVRecords(t *testing.T) {
	s := dnstest.Start(t)
	s.Set(t,
		"_w._tcp.pool. 5 IN SRV 0 0 8001 a.pool.",
		"_w._tcp.pool. 4 IN SRV 0 0 8002 b.pool.",
		"a.pool. 60 IN A 127.0.0.1",
		"b.pool. 2 IN A 127.0.0.1",
	)
	r := resolver(t, DNSOptions{Name: "_w._tcp.pool", SRV: true, Scheme: "https", Server: s.Addr, Timeout: time.Second})
	// The TTL is the smallest of the SRV and the target records'.
	wantResolved(t, r, []string{"https://127.0.0.1:8001", "https://127.0.0.1:8002"}, 2*time.Second)
}

func TestDNSResolverFailures(t *testing.T) {
	s := dnstest.Start(t)
	s.Set(t, "sim. 1 IN A 127.0.0.1")
	r := resolver(t, DNSOptions{Name: "gone", Port: 8000, Server: s.Addr, Timeout: time.Second})
	if a := r.Resolve(context.Background()); a.Err != nil || len(a.Endpoints) != 0 {
		t.Fatalf("NXDOMAIN: %+v, want an empty answer without error", a)
	}
	s.Fail(dns.RcodeServerFailure)
	r = resolver(t, DNSOptions{Name: "sim", Port: 8000, Server: s.Addr, Timeout: time.Second})
	if a := r.Resolve(context.Background()); a.Err == nil {
		t.Fatalf("SERVFAIL: %+v, want an error", a)
	}
	// Nobody listens: the query times out into an error, not a hang.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := pc.LocalAddr().String()
	_ = pc.Close()
	r = resolver(t, DNSOptions{Name: "sim", Port: 8000, Server: dead, Timeout: 200 * time.Millisecond})
	if a := r.Resolve(context.Background()); a.Err == nil {
		t.Fatalf("dead server: %+v, want an error", a)
	}
}

func TestNewDNSResolverRejectsBadOptions(t *testing.T) {
	if _, err := NewDNSResolver(DNSOptions{Port: 80, Server: "127.0.0.1:53"}); err == nil {
		t.Error("empty name accepted")
	}
	if _, err := NewDNSResolver(DNSOptions{Name: "x", Server: "127.0.0.1:53"}); err == nil {
		t.Error("A mode without a port accepted")
	}
	if _, err := NewDNSResolver(DNSOptions{Name: "a..b", Port: 80, Server: "127.0.0.1:53"}); err == nil {
		t.Error("invalid name accepted")
	}
}
