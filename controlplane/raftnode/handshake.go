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
// with K derived from a shared secret and a label per role. Both nonces
// are fresh per connection, so a recorded exchange proves nothing on a new
// one, and the role labels stop one side's proof being reflected as the
// other's. The handshake authenticates; it does not encrypt or protect the
// bytes that follow (raft_tls does).
//
// Two generations share that shape and differ in their magic, their key
// derivation and their labels: v2 (CARTRFT2) is keyed by the Raft token,
// a secret only control-plane nodes hold; v1 (CARTRFT1) is keyed by the
// cluster token, which every data plane holds too, so a node accepts it only
// while a rolling upgrade from a release without the Raft token is under
// way (LegacyToken). The dialer's magic names the generation it proves, and
// the listener answers in the same one or closes the connection.
const (
	nonceLen      = 32
	macLen        = sha256.Size
	maxPeerIDLen  = 255
	handshakeAck  = 0x01
	magicLen      = 8
	magicV1       = "CARTRFT1" // protocol and version: a plain raft RPC never starts with it
	magicV2       = "CARTRFT2"
	maxPreferred  = 1024 // addresses whose last working generation is remembered
	legacyLogRate = 0.1  // lines per second about peers still on the v1 handshake

	defaultHSTimeout  = 5 * time.Second
	defaultMaxConns   = 256
	failureLogBurst   = 5
	failureLogPerSecs = 1
)

// generation is one version of the handshake.
type generation struct {
	magic       string
	keyInfo     string // HKDF info: the key differs per generation even for one secret
	serverLabel string
	clientLabel string
	secret      string // the secret it proves, for error messages
}

var (
	genV2 = &generation{magic: magicV2, keyInfo: "cart raft peer authentication v2 (raft token)",
		serverLabel: "cart raft handshake v2: listener proof", clientLabel: "cart raft handshake v2: dialer proof",
		secret: "the Raft token (auth.raft_token)"}
	genV1 = &generation{magic: magicV1, keyInfo: "cart raft peer authentication v1",
		serverLabel: "cart raft handshake v1: listener proof", clientLabel: "cart raft handshake v1: dialer proof",
		secret: "the cluster token (auth.token)"}
)

// errHandshake marks a peer that failed authentication (as opposed to a
// network error), for the audit log.
var errHandshake = errors.New("raft peer handshake failed")

// peerKey is one generation's key.
type peerKey struct {
	gen *generation
	key []byte
}

// peerAuth is one node's handshake identity: the keys it accepts and dials
// with, the preferred (v2) first, and the node id it claims.
type peerAuth struct {
	keys   []peerKey
	nodeID string
}

// deriveKey separates the MAC key from the secret itself: the cluster token
// is also a bearer credential on the API, and a MAC key that equals a
// bearer secret would tie the two uses together.
func deriveKey(g *generation, secret string) ([]byte, error) {
	return hkdf.Key(sha256.New, []byte(secret), nil, g.keyInfo, 32)
}

// newPeerAuth builds a node's handshake keys: v2 from raftToken, v1 from
// legacyToken (the cluster token, during an upgrade), either may be empty
// but not both.
func newPeerAuth(nodeID, raftToken, legacyToken string) (*peerAuth, error) {
	if len(nodeID) == 0 || len(nodeID) > maxPeerIDLen {
		return nil, fmt.Errorf("raft peer authentication: node id must be 1-%d bytes", maxPeerIDLen)
	}
	a := &peerAuth{nodeID: nodeID}
	for _, s := range []struct {
		g      *generation
		secret string
	}{{genV2, raftToken}, {genV1, legacyToken}} {
		if s.secret == "" {
			continue
		}
		key, err := deriveKey(s.g, s.secret)
		if err != nil {
			return nil, err
		}
		a.keys = append(a.keys, peerKey{gen: s.g, key: key})
	}
	if len(a.keys) == 0 {
		return nil, errors.New("raft peer authentication: no token")
	}
	if raftToken != "" && raftToken == legacyToken {
		return nil, errors.New("raft peer authentication: the Raft token must differ from the cluster token")
	}
	return a, nil
}

// accepts returns the key of the generation magic names, if this node
// accepts it.
func (a *peerAuth) accepts(magic string) (peerKey, bool) {
	for _, k := range a.keys {
		if k.gen.magic == magic {
			return k, true
		}
	}
	return peerKey{}, false
}

func (k peerKey) mac(label string, nc, ns []byte, idc, ids string) []byte {
	h := hmac.New(sha256.New, k.key)
	h.Write([]byte(label))
	h.Write(nc)
	h.Write(ns)
	h.Write([]byte{byte(len(idc))})
	h.Write([]byte(idc))
	h.Write([]byte{byte(len(ids))})
	h.Write([]byte(ids))
	return h.Sum(nil)
}

func (a *peerAuth) hello(g *generation) ([]byte, []byte) {
	nonce := make([]byte, nonceLen)
	_, _ = rand.Read(nonce) // crypto/rand.Read never fails (it panics instead)
	msg := make([]byte, 0, magicLen+nonceLen+1+len(a.nodeID)+macLen)
	msg = append(msg, g.magic...)
	msg = append(msg, nonce...)
	msg = append(msg, byte(len(a.nodeID)))
	msg = append(msg, a.nodeID...)
	return msg, nonce
}

// readMagic reads the 8 bytes that open a hello. They come first and alone,
// so a peer speaking plain raft, or a generation this node does not accept,
// is refused after 8 bytes.
func readMagic(r io.Reader) (string, error) {
	var magic [magicLen]byte
	if _, err := io.ReadFull(r, magic[:]); err != nil {
		return "", fmt.Errorf("read hello: %w", err)
	}
	return string(magic[:]), nil
}

// readHelloRest reads the nonce and id that follow the magic.
func readHelloRest(r io.Reader) (nonce []byte, id string, err error) {
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

// refusedMagic explains a hello this node does not accept.
func (a *peerAuth) refusedMagic(magic string) error {
	switch magic {
	case magicV1:
		return fmt.Errorf("%w: peer proves the cluster token (the handshake of releases before auth.raft_token), which this node does not accept: "+
			"give every control-plane node auth.raft_token_file, and set auth.raft_accept_cluster_token only while a rolling upgrade is under way", errHandshake)
	case magicV2:
		return fmt.Errorf("%w: peer proves a Raft token, but this node has none (set auth.raft_token_file)", errHandshake)
	}
	return fmt.Errorf("%w: peer does not speak the CART raft handshake (no Raft token, or not a CART node)", errHandshake)
}

// serverHandshake authenticates a dialer on rw, in the generation it
// opened with, and returns its claimed node id and that generation. The
// caller bounds it with a deadline.
func (a *peerAuth) serverHandshake(rw io.ReadWriter) (string, *generation, error) {
	magic, err := readMagic(rw)
	if err != nil {
		return "", nil, err
	}
	k, ok := a.accepts(magic)
	if !ok {
		return "", nil, a.refusedMagic(magic)
	}
	nc, idc, err := readHelloRest(rw)
	if err != nil {
		return "", k.gen, err
	}
	msg, ns := a.hello(k.gen)
	msg = append(msg, k.mac(k.gen.serverLabel, nc, ns, idc, a.nodeID)...)
	if _, err := rw.Write(msg); err != nil {
		return idc, k.gen, fmt.Errorf("write hello: %w", err)
	}
	got := make([]byte, macLen)
	if _, err := io.ReadFull(rw, got); err != nil {
		return idc, k.gen, fmt.Errorf("read proof: %w", err)
	}
	// hmac.Equal is constant-time.
	if !hmac.Equal(got, k.mac(k.gen.clientLabel, nc, ns, idc, a.nodeID)) {
		return idc, k.gen, fmt.Errorf("%w: dialer %q did not prove knowledge of %s", errHandshake, idc, k.gen.secret)
	}
	if _, err := rw.Write([]byte{handshakeAck}); err != nil {
		return idc, k.gen, fmt.Errorf("write ack: %w", err)
	}
	return idc, k.gen, nil
}

// clientHandshake authenticates to the listener on rw with key k and
// returns its claimed node id. The listener proves itself first, so a
// dialer never sends its proof to a server that does not hold the key.
func (a *peerAuth) clientHandshake(rw io.ReadWriter, k peerKey) (string, error) {
	msg, nc := a.hello(k.gen)
	if _, err := rw.Write(msg); err != nil {
		return "", fmt.Errorf("write hello: %w", err)
	}
	magic, err := readMagic(rw)
	if err != nil {
		return "", err
	}
	if magic != k.gen.magic {
		return "", fmt.Errorf("%w: listener answered %q to a %s hello", errHandshake, magic, k.gen.magic)
	}
	ns, ids, err := readHelloRest(rw)
	if err != nil {
		return "", err
	}
	got := make([]byte, macLen)
	if _, err := io.ReadFull(rw, got); err != nil {
		return ids, fmt.Errorf("read proof: %w", err)
	}
	if !hmac.Equal(got, k.mac(k.gen.serverLabel, nc, ns, a.nodeID, ids)) {
		return ids, fmt.Errorf("%w: listener %q did not prove knowledge of %s", errHandshake, ids, k.gen.secret)
	}
	if _, err := rw.Write(k.mac(k.gen.clientLabel, nc, ns, a.nodeID, ids)); err != nil {
		return ids, fmt.Errorf("write proof: %w", err)
	}
	var ack [1]byte
	if _, err := io.ReadFull(rw, ack[:]); err != nil {
		return ids, fmt.Errorf("%w: listener %q refused our proof (a different %s?): %v", errHandshake, ids, k.gen.secret, err)
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
