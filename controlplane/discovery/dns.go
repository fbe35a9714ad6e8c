package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// Resolver answers one resolution of a worker source.
type Resolver interface {
	Resolve(ctx context.Context) Answer
}

// DNSOptions configure a DNS source.
type DNSOptions struct {
	// Name to resolve.
	Name string
	// SRV: SRV records (port from each record); otherwise A and AAAA
	// records on Port.
	SRV    bool
	Port   int
	Scheme string
	// Server is the DNS server's host:port; "" = the first nameserver of
	// /etc/resolv.conf.
	Server  string
	Timeout time.Duration
}

// DNSResolver queries one DNS server directly (not the system resolver), so
// a split-horizon server or a test's server can be named in the config.
type DNSResolver struct {
	o      DNSOptions
	name   string
	client *dns.Client
}

// NewDNSResolver checks o and fills in the default server.
func NewDNSResolver(o DNSOptions) (*DNSResolver, error) {
	if o.Name == "" {
		return nil, errors.New("dns discovery: name is empty")
	}
	if _, ok := dns.IsDomainName(o.Name); !ok || strings.ContainsAny(o.Name, " \t") {
		return nil, fmt.Errorf("dns discovery: %q is not a valid DNS name", o.Name)
	}
	if !o.SRV && (o.Port < 1 || o.Port > 65535) {
		return nil, fmt.Errorf("dns discovery: port %d out of range", o.Port)
	}
	if o.Scheme == "" {
		o.Scheme = "http"
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Second
	}
	if o.Server == "" {
		cc, err := dns.ClientConfigFromFile("/etc/resolv.conf")
		if err != nil {
			return nil, fmt.Errorf("dns discovery: no resolver configured and /etc/resolv.conf unusable: %w", err)
		}
		if len(cc.Servers) == 0 {
			return nil, errors.New("dns discovery: no resolver configured and /etc/resolv.conf lists no nameserver")
		}
		o.Server = net.JoinHostPort(cc.Servers[0], cc.Port)
	}
	return &DNSResolver{o: o, name: dns.Fqdn(o.Name), client: &dns.Client{Timeout: o.Timeout}}, nil
}

// Server is the DNS server queried.
func (r *DNSResolver) Server() string { return r.o.Server }

// Resolve implements Resolver. Any failed query fails the whole answer: a
// partial answer would look like endpoints leaving.
func (r *DNSResolver) Resolve(ctx context.Context) Answer {
	if r.o.SRV {
		return r.resolveSRV(ctx)
	}
	ips, ttl, err := r.addrs(ctx, r.name, nil)
	if err != nil {
		return Answer{Err: err}
	}
	a := Answer{TTL: ttl}
	for _, ip := range ips {
		a.Endpoints = append(a.Endpoints, r.url(ip, r.o.Port))
	}
	slices.Sort(a.Endpoints)
	return a
}

func (r *DNSResolver) resolveSRV(ctx context.Context) Answer {
	resp, err := r.query(ctx, r.name, dns.TypeSRV)
	if err != nil {
		return Answer{Err: err}
	}
	ttl := time.Duration(-1)
	a := Answer{}
	for _, rr := range resp.Answer {
		srv, ok := rr.(*dns.SRV)
		if !ok {
			continue
		}
		ttl = minTTL(ttl, srv.Hdr.Ttl)
		// Servers usually send the targets' addresses along; ask only when
		// they did not.
		ips, t, err := r.addrs(ctx, dns.Fqdn(srv.Target), resp.Extra)
		if err != nil {
			return Answer{Err: fmt.Errorf("SRV target %s: %w", srv.Target, err)}
		}
		if len(ips) > 0 {
			ttl = min(ttl, t)
		}
		for _, ip := range ips {
			a.Endpoints = append(a.Endpoints, r.url(ip, int(srv.Port)))
		}
	}
	slices.Sort(a.Endpoints)
	a.Endpoints = slices.Compact(a.Endpoints)
	a.TTL = max(ttl, 0)
	return a
}

// addrs returns the A and AAAA addresses of name, from extra when it holds
// any, else by asking.
func (r *DNSResolver) addrs(ctx context.Context, name string, extra []dns.RR) ([]net.IP, time.Duration, error) {
	ttl := time.Duration(-1)
	var ips []net.IP
	add := func(rr dns.RR) {
		switch v := rr.(type) {
		case *dns.A:
			ips = append(ips, v.A)
			ttl = minTTL(ttl, v.Hdr.Ttl)
		case *dns.AAAA:
			ips = append(ips, v.AAAA)
			ttl = minTTL(ttl, v.Hdr.Ttl)
		}
	}
	for _, rr := range extra {
		if strings.EqualFold(rr.Header().Name, name) {
			add(rr)
		}
	}
	if len(ips) > 0 {
		return ips, ttl, nil
	}
	for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
		resp, err := r.query(ctx, name, qt)
		if err != nil {
			return nil, 0, err
		}
		// CNAME chains are answered in the same message; matching the
		// final name would need following them, so take every address
		// record of the answer instead.
		for _, rr := range resp.Answer {
			add(rr)
		}
	}
	return ips, max(ttl, 0), nil
}

// query asks one question, over TCP when the UDP answer was truncated. A
// name that does not exist is an empty answer, not an error (a service
// scaled to zero looks like that); the reconciler keeps the last set for
// both.
func (r *DNSResolver) query(ctx context.Context, name string, qtype uint16) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.SetEdns0(4096, false)
	resp, _, err := r.client.ExchangeContext(ctx, m, r.o.Server)
	if err == nil && resp.Truncated {
		tcp := &dns.Client{Net: "tcp", Timeout: r.o.Timeout}
		resp, _, err = tcp.ExchangeContext(ctx, m, r.o.Server)
	}
	if err != nil {
		return nil, fmt.Errorf("query %s %s at %s: %w", dns.TypeToString[qtype], name, r.o.Server, err)
	}
	switch resp.Rcode {
	case dns.RcodeSuccess, dns.RcodeNameError:
		return resp, nil
	default:
		return nil, fmt.Errorf("query %s %s at %s: %s", dns.TypeToString[qtype], name, r.o.Server, dns.RcodeToString[resp.Rcode])
	}
}

func (r *DNSResolver) url(ip net.IP, port int) string {
	return r.o.Scheme + "://" + net.JoinHostPort(ip.String(), strconv.Itoa(port))
}

func minTTL(cur time.Duration, ttl uint32) time.Duration {
	d := time.Duration(ttl) * time.Second
	if cur < 0 || d < cur {
		return d
	}
	return cur
}
