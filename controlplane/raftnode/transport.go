package raftnode

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// streamLayer is raft's TCP stream layer, optionally with TLS on both
// sides. raft's own TCPStreamLayer cannot do TLS, and the control plane's
// log carries the worker set, so peers must authenticate each other.
//
// It also tracks its connections: raft's NetworkTransport closes only the
// listener on Close, leaving pooled outbound connections and the goroutines
// serving inbound ones alive until the peer hangs up. A stopped node must
// let go of its peers, so Close closes them all.
type streamLayer struct {
	ln        net.Listener
	advertise advertiseAddr
	dialTLS   *tls.Config // nil: plain TCP

	mu     sync.Mutex
	closed bool
	conns  map[*trackedConn]struct{}
}

var _ raft.StreamLayer = (*streamLayer)(nil)

// advertiseAddr keeps the advertised address as the operator wrote it. A
// resolved net.TCPAddr would turn a host name into an IP, and peers that
// verify TLS server names against DNS SANs would then reject it.
type advertiseAddr string

func (a advertiseAddr) Network() string { return "tcp" }
func (a advertiseAddr) String() string  { return string(a) }

// newStreamLayer listens on bind. advertise is what peers dial ("" = the
// address actually bound, which resolves a :0 port). A serverTLS with
// ClientCAs but no ClientAuth is upgraded to require and verify client
// certificates: setting a CA for clients and then not checking them is
// never what a Raft peer wants.
func newStreamLayer(bind, advertise string, serverTLS, clientTLS *tls.Config) (*streamLayer, error) {
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, fmt.Errorf("raft transport: listen on %s: %w", bind, err)
	}
	adv := advertise
	if adv == "" {
		adv = ln.Addr().String()
	}
	if err := checkAdvertise(adv); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("raft transport: %w", err)
	}
	if serverTLS != nil {
		cfg := serverTLS.Clone()
		if cfg.ClientCAs != nil && cfg.ClientAuth == tls.NoClientCert {
			cfg.ClientAuth = tls.RequireAndVerifyClientCert
		}
		ln = tls.NewListener(ln, cfg)
	}
	return &streamLayer{ln: ln, advertise: advertiseAddr(adv), dialTLS: clientTLS, conns: map[*trackedConn]struct{}{}}, nil
}

// checkAdvertise rejects addresses peers could not dial back: a wildcard
// host or port would be stored in the cluster configuration and break
// replication to this node later, far from the cause.
func checkAdvertise(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("advertise address %q: %w", addr, err)
	}
	if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
		return fmt.Errorf("advertise address %q: port must be 1-65535", addr)
	}
	if host == "" {
		return fmt.Errorf("advertise address %q has no host", addr)
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return fmt.Errorf("advertise address %q is a wildcard; set AdvertiseAddr to an address peers can dial", addr)
	}
	return nil
}

func (s *streamLayer) Addr() net.Addr { return s.advertise }

func (s *streamLayer) Accept() (net.Conn, error) {
	conn, err := s.ln.Accept()
	if err != nil {
		return nil, err
	}
	return s.track(conn)
}

// Close stops accepting and closes every open connection.
func (s *streamLayer) Close() error {
	s.mu.Lock()
	s.closed = true
	conns := s.conns
	s.conns = map[*trackedConn]struct{}{}
	s.mu.Unlock()
	err := s.ln.Close()
	for c := range conns {
		c.dropped.Store(true)
		_ = c.Conn.Close()
	}
	return err
}

func (s *streamLayer) track(conn net.Conn) (net.Conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = conn.Close()
		return nil, net.ErrClosed
	}
	c := &trackedConn{Conn: conn, s: s}
	s.conns[c] = struct{}{}
	return c, nil
}

func (s *streamLayer) forget(c *trackedConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
}

type trackedConn struct {
	net.Conn
	s *streamLayer
	// dropped marks a connection closed by Close. Its reads then end with
	// io.EOF, which raft treats as a peer hanging up, instead of "use of
	// closed network connection", which it logs as an error on every
	// ordinary shutdown.
	dropped atomic.Bool
}

func (c *trackedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil && c.dropped.Load() {
		err = io.EOF
	}
	return n, err
}

func (c *trackedConn) Close() error {
	c.s.forget(c)
	return c.Conn.Close()
}

// Dial connects to a peer. With TLS the handshake completes inside the
// dial timeout, so a peer that accepts but never answers costs one timeout,
// not a stuck replication goroutine.
func (s *streamLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout}
	var (
		conn net.Conn
		err  error
	)
	if s.dialTLS == nil {
		conn, err = d.Dial("tcp", string(addr))
	} else {
		conn, err = tls.DialWithDialer(d, "tcp", string(addr), s.dialTLS)
	}
	if err != nil {
		return nil, fmt.Errorf("dial raft peer %s: %w", addr, err)
	}
	return s.track(conn)
}
