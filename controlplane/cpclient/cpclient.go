// Package cpclient builds the HTTP client every caller of the control-plane
// API uses (data planes, cartctl, followers forwarding to the leader): HTTP/2
// over TLS when a CA or client certificate is configured, HTTP/2 with prior
// knowledge (h2c) otherwise, so gRPC works either way.
//
// Dead connections. A network partition (a firewall dropping packets, a
// peer host gone without a reset) leaves a TCP connection that neither
// fails nor delivers: writes are taken by the kernel, nothing comes back,
// and after the link heals it stays silent until TCP's retransmission
// timer, backed off during the partition, fires again (12.5 s after a
// partition of issue 32's length). HTTP/2 puts every call to a node on one
// such connection, so without a check the data plane kept reusing it and
// fell back for every request all that time. The transport therefore sends
// an HTTP/2 PING on a connection that has received nothing for
// PingAfterIdle and closes it when the answer does not come within
// PingTimeout: a dead connection is dropped within two seconds of its last
// frame, and the next call dials afresh. A busy connection receives frames
// all the time and is never pinged; an idle one costs one PING a second.
// Transport.DropConns lets a caller force a fresh dial when calls keep
// timing out on a connection whose PINGs are still answered (an HTTP/2
// proxy in between answers them for a dead upstream).
package cpclient

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/cartrouter/cart/config"
)

// The connection health check (see the package comment). net/http's own
// HTTP/2 settings (Go 1.24+) are used rather than golang.org/x/net/http2's
// Transport.ReadIdleTimeout: they configure the transport that already
// serves both TLS (h2) and prior-knowledge cleartext (h2c) through
// Transport.Protocols, so both paths get the check from one setting, with
// no second HTTP/2 implementation linked in and no DialTLS trick for h2c.
const (
	// PingAfterIdle is how long a connection may receive no frame before
	// it is sent a PING.
	PingAfterIdle = time.Second
	// PingTimeout is how long the PING's answer may take before the
	// connection is closed. A second is orders of magnitude above a
	// data centre's round trip; a node that cannot answer a PING in a
	// second has long missed every route timeout.
	PingTimeout = time.Second
)

// New returns an HTTP/2 client for the control-plane API.
func New(c config.ClientTLS) (*http.Client, error) {
	tc, err := c.Config()
	if err != nil {
		return nil, err
	}
	return NewWithTLS(tc), nil
}

// NewWithTLS returns an HTTP/2 client; tc nil means h2c. Its Transport is
// a *Transport.
func NewWithTLS(tc *tls.Config) *http.Client {
	conns := &connSet{by: map[string]map[*trackedConn]struct{}{}}
	d := &net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}
	t := &http.Transport{
		DialContext:         conns.dialer(d.DialContext),
		TLSClientConfig:     tc,
		TLSHandshakeTimeout: 2 * time.Second,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   true,
		HTTP2:               &http.HTTP2Config{SendPingTimeout: PingAfterIdle, PingTimeout: PingTimeout},
	}
	var p http.Protocols
	if tc == nil {
		p.SetUnencryptedHTTP2(true)
	} else {
		p.SetHTTP2(true)
	}
	t.Protocols = &p
	return &http.Client{Transport: &Transport{Transport: t, conns: conns}}
}

// Transport is the control-plane client's transport: net/http's, with the
// HTTP/2 health check, and able to close every connection to one node.
type Transport struct {
	*http.Transport
	conns *connSet
}

// DropConns closes every open connection to the node at rawURL (its host
// and port; calls in flight on them fail), so that the next call dials a
// new one. It returns how many it closed.
func (t *Transport) DropConns(rawURL string) int {
	u, err := url.Parse(rawURL)
	if err != nil {
		return 0
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	// The address net/http dials for the URL (it adds the scheme's port).
	return t.conns.drop(net.JoinHostPort(u.Hostname(), port))
}

// connSet is every open connection the transport dialed, by address.
type connSet struct {
	mu sync.Mutex
	by map[string]map[*trackedConn]struct{}
}

type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// dialer wraps dial so that each connection is in the set until closed.
func (s *connSet) dialer(dial dialFunc) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		tc := &trackedConn{Conn: c, set: s, addr: addr}
		s.mu.Lock()
		m := s.by[addr]
		if m == nil {
			m = map[*trackedConn]struct{}{}
			s.by[addr] = m
		}
		m[tc] = struct{}{}
		s.mu.Unlock()
		return tc, nil
	}
}

func (s *connSet) remove(c *trackedConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.by[c.addr]; m != nil {
		delete(m, c)
		if len(m) == 0 {
			delete(s.by, c.addr)
		}
	}
}

// drop closes the connections to addr, outside the lock: a Close may
// block on the socket.
func (s *connSet) drop(addr string) int {
	s.mu.Lock()
	var cs []*trackedConn
	for c := range s.by[addr] {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	for _, c := range cs {
		_ = c.Close()
	}
	return len(cs)
}

// trackedConn leaves its set when closed, by the transport or by drop.
type trackedConn struct {
	net.Conn
	set  *connSet
	addr string
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() { c.set.remove(c) })
	return c.Conn.Close()
}
