package raftnode

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// streamLayer is raft's TCP stream layer, optionally with TLS on both
// sides and a peer handshake keyed by the Raft token. raft's own
// TCPStreamLayer can do neither, and the control plane's log carries the
// worker set, so peers must authenticate each other before the first RPC.
//
// Inbound connections are authenticated on their own goroutine, under a
// deadline, before Accept hands them to raft: raft's transport gives every
// accepted connection a 256 KiB read buffer and a goroutine with no
// deadline, so an unauthenticated one must never get that far. The number
// of inbound connections (authenticating or accepted) is capped; beyond it
// a new one is closed at once.
//
// It also tracks its connections: raft's NetworkTransport closes only the
// listener on Close, leaving pooled outbound connections and the goroutines
// serving inbound ones alive until the peer hangs up. A stopped node must
// let go of its peers, so Close closes them all.
type streamLayer struct {
	ln        net.Listener
	advertise advertiseAddr
	dialTLS   *tls.Config // nil: plain TCP
	opts      streamOptions
	failLog   *limitedLog
	legacyLog *limitedLog // peers still on the v1 (cluster token) handshake

	accepted chan net.Conn
	done     chan struct{}
	wg       sync.WaitGroup // accept loop and handshakes in progress

	mu      sync.Mutex
	closed  bool
	conns   map[*trackedConn]struct{}
	inbound int
	// preferred is the handshake generation (index into opts.auth.keys)
	// that last worked with each address, so that during an upgrade a
	// node does not try v2 first on every dial of a peer that only speaks
	// v1. Bounded by maxPreferred (cleared when full).
	preferred map[raft.ServerAddress]int
}

// streamOptions are the stream layer's security settings.
type streamOptions struct {
	auth             *peerAuth     // nil: no handshake
	handshakeTimeout time.Duration // TLS and peer handshake, each direction
	maxInbound       int
	log              *slog.Logger
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
func newStreamLayer(bind, advertise string, serverTLS, clientTLS *tls.Config, opts streamOptions) (*streamLayer, error) {
	if opts.handshakeTimeout <= 0 {
		opts.handshakeTimeout = defaultHSTimeout
	}
	if opts.maxInbound <= 0 {
		opts.maxInbound = defaultMaxConns
	}
	if opts.log == nil {
		opts.log = slog.Default()
	}
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
	s := &streamLayer{
		ln: ln, advertise: advertiseAddr(adv), dialTLS: clientTLS, opts: opts,
		failLog:   newLimitedLog(opts.log.With("audit", true), failureLogBurst, failureLogPerSecs),
		legacyLog: newLimitedLog(opts.log, 1, legacyLogRate),
		accepted:  make(chan net.Conn),
		done:      make(chan struct{}),
		conns:     map[*trackedConn]struct{}{},
		preferred: map[raft.ServerAddress]int{},
	}
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
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

// Accept returns the next authenticated inbound connection.
func (s *streamLayer) Accept() (net.Conn, error) {
	select {
	case c := <-s.accepted:
		return c, nil
	case <-s.done:
		return nil, net.ErrClosed
	}
}

func (s *streamLayer) acceptLoop() {
	defer s.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			if s.isClosed() || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: wait, as net/http does,
			// rather than spin or give up on the listener.
			s.opts.log.Warn("raft transport: accept failed; retrying", "error", err.Error(), "backoff", backoff.String())
			select {
			case <-s.done:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		c, ok := s.admit(conn)
		if !ok {
			continue
		}
		s.wg.Add(1)
		go s.authenticate(c)
	}
}

// admit tracks an inbound connection, or closes it at once when the cap is
// reached or the layer is closed.
func (s *streamLayer) admit(conn net.Conn) (*trackedConn, bool) {
	s.mu.Lock()
	if s.closed || s.inbound >= s.opts.maxInbound {
		closed := s.closed
		s.mu.Unlock()
		_ = conn.Close()
		if !closed {
			s.failLog.Warn("raft transport: connection refused: inbound connection cap reached",
				"remote", conn.RemoteAddr().String(), "max_conns", s.opts.maxInbound)
		}
		return nil, false
	}
	c := &trackedConn{Conn: conn, s: s, inbound: true}
	s.conns[c] = struct{}{}
	s.inbound++
	s.mu.Unlock()
	return c, true
}

// authenticate runs the TLS handshake (if any) and the peer handshake (if
// a token is set) under one deadline, then hands the connection to Accept.
func (s *streamLayer) authenticate(c *trackedConn) {
	defer s.wg.Done()
	_ = c.SetDeadline(time.Now().Add(s.opts.handshakeTimeout))
	peer, gen, err := s.serverHandshake(c)
	if err == nil && gen == genV1 {
		s.legacyPeer("inbound", c.RemoteAddr().String(), peer)
	}
	if err != nil {
		_ = c.Close()
		if !c.dropped.Load() {
			s.failLog.Warn("raft transport: inbound peer failed authentication; connection closed",
				"remote", c.RemoteAddr().String(), "claimed_id", peer, "error", err.Error())
		}
		return
	}
	_ = c.SetDeadline(time.Time{})
	select {
	case s.accepted <- c:
	case <-s.done:
		_ = c.Close()
	}
}

// tlsHandshake completes TLS on c, if it is a TLS connection.
func tlsHandshake(c *trackedConn) error {
	if tc, ok := c.Conn.(*tls.Conn); ok {
		if err := tc.Handshake(); err != nil {
			return fmt.Errorf("%w: TLS: %v", errHandshake, err)
		}
	}
	return nil
}

// serverHandshake completes TLS and the peer handshake on an inbound c,
// returning the peer's claimed node id and the handshake generation it
// used ("" and nil without a peer handshake).
func (s *streamLayer) serverHandshake(c *trackedConn) (string, *generation, error) {
	if err := tlsHandshake(c); err != nil {
		return "", nil, err
	}
	if s.opts.auth == nil {
		return "", nil, nil
	}
	return s.opts.auth.serverHandshake(c)
}

// legacyPeer notes a peer authenticated with the cluster token (v1): fine
// during an upgrade, but the transition setting must go once every node
// has the Raft token, or the cluster token keeps opening the Raft port.
func (s *streamLayer) legacyPeer(dir, remote, peer string) {
	s.legacyLog.Warn("raft transport: peer authenticated with the cluster token (the handshake of releases before auth.raft_token); "+
		"once every node runs with auth.raft_token_file, remove auth.raft_accept_cluster_token everywhere",
		"direction", dir, "remote", remote, "claimed_id", peer)
}

func (s *streamLayer) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Close stops accepting and closes every open connection, and waits for
// the accept loop and handshakes in progress to end.
func (s *streamLayer) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	conns := s.conns
	s.conns = map[*trackedConn]struct{}{}
	s.inbound = 0
	s.mu.Unlock()
	err := s.ln.Close()
	for c := range conns {
		c.dropped.Store(true)
		_ = c.Conn.Close()
	}
	s.wg.Wait()
	return err
}

// inboundCount is the number of inbound connections held (tests).
func (s *streamLayer) inboundCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inbound
}

func (s *streamLayer) trackOutbound(conn net.Conn) (*trackedConn, error) {
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
	if _, ok := s.conns[c]; !ok {
		return
	}
	delete(s.conns, c)
	if c.inbound {
		s.inbound--
	}
}

type trackedConn struct {
	net.Conn
	s       *streamLayer
	inbound bool
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

// Dial connects to a peer. The TLS and peer handshakes complete inside
// the dial timeout (and the handshake timeout), so a peer that accepts but
// never answers costs one timeout, not a stuck replication goroutine.
//
// A node that holds keys of two handshake generations (an upgrade in
// progress) tries the one that last worked with addr first, v2 for a new
// address, and the other on a new connection if the peer refuses it: an
// old node closes a connection whose hello it does not know, a node that
// no longer accepts v1 does the same.
func (s *streamLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	if timeout <= 0 || timeout > s.opts.handshakeTimeout {
		timeout = s.opts.handshakeTimeout
	}
	deadline := time.Now().Add(timeout)
	if s.opts.auth == nil {
		c, err := s.dial(addr, deadline)
		if err != nil {
			return nil, err
		}
		_ = c.SetDeadline(deadline)
		if err := tlsHandshake(c); err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("dial raft peer %s: %w", addr, err)
		}
		_ = c.SetDeadline(time.Time{})
		return c, nil
	}
	keys := s.opts.auth.keys
	first := s.preferredKey(addr)
	var errs []error
	peer := ""
	for i := range keys {
		k := (first + i) % len(keys)
		c, err := s.dial(addr, deadline)
		if err != nil {
			// Not reachable: another generation would not be either.
			errs = append(errs, err)
			break
		}
		_ = c.SetDeadline(deadline)
		var id string
		err = tlsHandshake(c)
		if err == nil {
			id, err = s.opts.auth.clientHandshake(c, keys[k])
		}
		if err == nil {
			_ = c.SetDeadline(time.Time{})
			s.setPreferred(addr, k)
			if keys[k].gen == genV1 {
				s.legacyPeer("outbound", string(addr), id)
			}
			return c, nil
		}
		_ = c.Close()
		if id != "" {
			peer = id
		}
		errs = append(errs, fmt.Errorf("%s handshake: %w", keys[k].gen.magic, err))
		if time.Until(deadline) <= 0 {
			break
		}
	}
	err := errors.Join(errs...)
	if errors.Is(err, errHandshake) {
		s.failLog.Warn("raft transport: outbound peer failed authentication; connection closed",
			"remote", string(addr), "claimed_id", peer, "error", err.Error())
	}
	return nil, fmt.Errorf("dial raft peer %s: %w", addr, err)
}

// dial opens a tracked connection to addr (TLS not yet negotiated).
func (s *streamLayer) dial(addr raft.ServerAddress, deadline time.Time) (*trackedConn, error) {
	d := &net.Dialer{Deadline: deadline}
	conn, err := d.Dial("tcp", string(addr))
	if err != nil {
		return nil, fmt.Errorf("dial raft peer %s: %w", addr, err)
	}
	if s.dialTLS != nil {
		conn = tls.Client(conn, tlsFor(s.dialTLS, string(addr)))
	}
	return s.trackOutbound(conn)
}

// tlsFor fills in the server name from addr, as tls.Dial would.
func tlsFor(cfg *tls.Config, addr string) *tls.Config {
	if cfg.ServerName != "" {
		return cfg
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	c := cfg.Clone()
	c.ServerName = host
	return c
}

func (s *streamLayer) preferredKey(addr raft.ServerAddress) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.preferred[addr]
}

func (s *streamLayer) setPreferred(addr raft.ServerAddress, k int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.preferred[addr]; !ok && len(s.preferred) >= maxPreferred {
		clear(s.preferred)
	}
	s.preferred[addr] = k
}
