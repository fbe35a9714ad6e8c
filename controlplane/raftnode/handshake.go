package raftnode

import (
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"
)

// The peer handshake runs on every Raft connection before the first RPC
// byte (inside TLS when raft_tls is on):
//
//	dialer   -> listener: magic | nonce_c | len | id_c
//	listener -> dialer:   magic | nonce_s | len | id_s | mac_s
//	dialer   -> listener: mac_c
//	listener -> dialer:   ack
//
// mac_x = HMAC-SHA256(K, label_x | nonce_c | nonce_s | len | id_c | len | id_s)
// with K derived from the cluster token and a label per role. Both nonces
// are fresh per connection, so a recorded exchange proves nothing on a new
// one, and the role labels stop one side's proof being reflected as the
// other's. The handshake authenticates; it does not encrypt or protect the
// bytes that follow (raft_tls does).
const (
	handshakeMagic = "CARTRFT1" // protocol and version: a plain raft RPC never starts with it
	nonceLen       = 32
	macLen         = sha256.Size
	maxPeerIDLen   = 255
	handshakeAck   = 0x01

	raftKeyInfo       = "cart raft peer authentication v1"
	labelServerProof  = "cart raft handshake v1: listener proof"
	labelClientProof  = "cart raft handshake v1: dialer proof"
	defaultHSTimeout  = 5 * time.Second
	defaultMaxConns   = 256
	failureLogBurst   = 5
	failureLogPerSecs = 1
)

// errHandshake marks a peer that failed authentication (as opposed to a
// network error), for the audit log.
var errHandshake = errors.New("raft peer handshake failed")

// peerAuth is one node's handshake identity: the key every member derives
// from the cluster token, and the node id it claims.
type peerAuth struct {
	key    []byte
	nodeID string
}

// deriveRaftKey separates the Raft key from the token itself: the token is
// also a bearer credential on the API, and a MAC key that equals a bearer
// secret would tie the two uses together.
func deriveRaftKey(token string) ([]byte, error) {
	if token == "" {
		return nil, errors.New("raft peer authentication: empty cluster token")
	}
	return hkdf.Key(sha256.New, []byte(token), nil, raftKeyInfo, 32)
}

func newPeerAuth(token, nodeID string) (*peerAuth, error) {
	if len(nodeID) == 0 || len(nodeID) > maxPeerIDLen {
		return nil, fmt.Errorf("raft peer authentication: node id must be 1-%d bytes", maxPeerIDLen)
	}
	key, err := deriveRaftKey(token)
	if err != nil {
		return nil, err
	}
	return &peerAuth{key: key, nodeID: nodeID}, nil
}

func (a *peerAuth) mac(label string, nc, ns []byte, idc, ids string) []byte {
	h := hmac.New(sha256.New, a.key)
	h.Write([]byte(label))
	h.Write(nc)
	h.Write(ns)
	h.Write([]byte{byte(len(idc))})
	h.Write([]byte(idc))
	h.Write([]byte{byte(len(ids))})
	h.Write([]byte(ids))
	return h.Sum(nil)
}

func (a *peerAuth) hello() ([]byte, []byte) {
	nonce := make([]byte, nonceLen)
	_, _ = rand.Read(nonce) // crypto/rand.Read never fails (it panics instead)
	msg := make([]byte, 0, len(handshakeMagic)+nonceLen+1+len(a.nodeID)+macLen)
	msg = append(msg, handshakeMagic...)
	msg = append(msg, nonce...)
	msg = append(msg, byte(len(a.nodeID)))
	msg = append(msg, a.nodeID...)
	return msg, nonce
}

// readHello reads the peer's magic, nonce and id. The magic comes first
// and alone, so a peer speaking plain raft is refused after 8 bytes.
func readHello(r io.Reader) (nonce []byte, id string, err error) {
	var magic [len(handshakeMagic)]byte
	if _, err := io.ReadFull(r, magic[:]); err != nil {
		return nil, "", fmt.Errorf("read hello: %w", err)
	}
	if string(magic[:]) != handshakeMagic {
		return nil, "", fmt.Errorf("%w: peer does not speak the CART raft handshake (no cluster token, or not a CART node)", errHandshake)
	}
	buf := make([]byte, nonceLen+1)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, "", fmt.Errorf("read hello: %w", err)
	}
	n := int(buf[nonceLen])
	if n == 0 {
		return nil, "", fmt.Errorf("%w: empty node id", errHandshake)
	}
	idb := make([]byte, n)
	if _, err := io.ReadFull(r, idb); err != nil {
		return nil, "", fmt.Errorf("read hello: %w", err)
	}
	return buf[:nonceLen], string(idb), nil
}

// serverHandshake authenticates a dialer on rw and returns its claimed
// node id. The caller bounds it with a deadline.
func (a *peerAuth) serverHandshake(rw io.ReadWriter) (string, error) {
	nc, idc, err := readHello(rw)
	if err != nil {
		return "", err
	}
	msg, ns := a.hello()
	msg = append(msg, a.mac(labelServerProof, nc, ns, idc, a.nodeID)...)
	if _, err := rw.Write(msg); err != nil {
		return idc, fmt.Errorf("write hello: %w", err)
	}
	got := make([]byte, macLen)
	if _, err := io.ReadFull(rw, got); err != nil {
		return idc, fmt.Errorf("read proof: %w", err)
	}
	// hmac.Equal is constant-time.
	if !hmac.Equal(got, a.mac(labelClientProof, nc, ns, idc, a.nodeID)) {
		return idc, fmt.Errorf("%w: dialer %q did not prove knowledge of the cluster token", errHandshake, idc)
	}
	if _, err := rw.Write([]byte{handshakeAck}); err != nil {
		return idc, fmt.Errorf("write ack: %w", err)
	}
	return idc, nil
}

// clientHandshake authenticates to the listener on rw and returns its
// claimed node id. The listener proves itself first, so a dialer never
// sends its proof to a server that does not hold the key.
func (a *peerAuth) clientHandshake(rw io.ReadWriter) (string, error) {
	msg, nc := a.hello()
	if _, err := rw.Write(msg); err != nil {
		return "", fmt.Errorf("write hello: %w", err)
	}
	ns, ids, err := readHello(rw)
	if err != nil {
		return "", err
	}
	got := make([]byte, macLen)
	if _, err := io.ReadFull(rw, got); err != nil {
		return ids, fmt.Errorf("read proof: %w", err)
	}
	if !hmac.Equal(got, a.mac(labelServerProof, nc, ns, a.nodeID, ids)) {
		return ids, fmt.Errorf("%w: listener %q did not prove knowledge of the cluster token", errHandshake, ids)
	}
	if _, err := rw.Write(a.mac(labelClientProof, nc, ns, a.nodeID, ids)); err != nil {
		return ids, fmt.Errorf("write proof: %w", err)
	}
	var ack [1]byte
	if _, err := io.ReadFull(rw, ack[:]); err != nil {
		return ids, fmt.Errorf("%w: listener %q refused our proof (different cluster token?): %v", errHandshake, ids, err)
	}
	if ack[0] != handshakeAck {
		return ids, fmt.Errorf("%w: listener %q sent an invalid ack", errHandshake, ids)
	}
	return ids, nil
}

// limitedLog rate-limits the audit lines for refused connections: an
// attacker opening connections as fast as it can must not be able to fill
// the disk or drown the log. Dropped lines are counted and reported with
// the next one that passes.
type limitedLog struct {
	log   *slog.Logger
	burst float64
	rate  float64 // tokens per second
	now   func() time.Time

	mu         sync.Mutex
	tokens     float64
	last       time.Time
	suppressed int
}

func newLimitedLog(log *slog.Logger, burst int, perSec float64) *limitedLog {
	return &limitedLog{log: log, burst: float64(burst), rate: perSec, tokens: float64(burst), now: time.Now}
}

// Warn logs msg unless the budget is spent.
func (l *limitedLog) Warn(msg string, args ...any) {
	l.mu.Lock()
	now := l.now()
	if !l.last.IsZero() {
		l.tokens = min(l.burst, l.tokens+now.Sub(l.last).Seconds()*l.rate)
	}
	l.last = now
	if l.tokens < 1 {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	l.tokens--
	suppressed := l.suppressed
	l.suppressed = 0
	l.mu.Unlock()
	if suppressed > 0 {
		args = append(args, "suppressed_since_last", suppressed)
	}
	l.log.Warn(msg, args...)
}
