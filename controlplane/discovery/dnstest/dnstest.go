// Package dnstest runs an in-process authoritative DNS server on
// 127.0.0.1 (UDP) whose records a test changes while it runs.
package dnstest

import (
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/miekg/dns"
)

// Server answers from a record set the test replaces at will.
type Server struct {
	Addr string
	mu   sync.Mutex
	rrs  []dns.RR
	fail int // rcode to answer with instead of records; 0 = none
	srv  *dns.Server
}

// Start serves until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: pc.LocalAddr().String()}
	started := make(chan struct{})
	s.srv = &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(s.serve), NotifyStartedFunc: func() { close(started) }}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.srv.ActivateAndServe()
	}()
	<-started
	t.Cleanup(func() {
		_ = s.srv.Shutdown()
		<-done
	})
	return s
}

// Set replaces every record with the ones given in zone-file syntax, e.g.
// "sim. 1 IN A 127.0.0.1" or "_w._tcp.sim. 1 IN SRV 0 0 8001 a.sim.".
func (s *Server) Set(t testing.TB, records ...string) {
	t.Helper()
	rrs := make([]dns.RR, 0, len(records))
	for _, r := range records {
		rr, err := dns.NewRR(r)
		if err != nil {
			t.Fatalf("record %q: %v", r, err)
		}
		rrs = append(rrs, rr)
	}
	s.mu.Lock()
	s.rrs, s.fail = rrs, 0
	s.mu.Unlock()
}

// Fail makes every answer carry rcode (e.g. dns.RcodeServerFailure) until
// the next Set.
func (s *Server) Fail(rcode int) {
	s.mu.Lock()
	s.fail = rcode
	s.mu.Unlock()
}

func (s *Server) serve(w dns.ResponseWriter, req *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	s.mu.Lock()
	if s.fail != 0 {
		m.Rcode = s.fail
	} else if len(req.Question) == 1 {
		q := req.Question[0]
		known := false
		for _, rr := range s.rrs {
			h := rr.Header()
			if !strings.EqualFold(h.Name, q.Name) {
				continue
			}
			known = true
			if h.Rrtype == q.Qtype {
				m.Answer = append(m.Answer, dns.Copy(rr))
			}
		}
		if !known {
			m.Rcode = dns.RcodeNameError
		}
	}
	s.mu.Unlock()
	_ = w.WriteMsg(m)
}
