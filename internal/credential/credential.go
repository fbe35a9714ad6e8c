// Package credential is what every CART listener's authentication shares: the
// bearer token of a request, secrets compared in constant time, and
// loopback peers (which an unconfigured listener serves alone). The
// control plane's API and the data plane's client port decide who may do
// what differently; how they read and compare a credential is one rule.
package credential

import (
	"crypto/sha256"
	"crypto/subtle"
	"net"
	"net/http"
	"strings"
)

// BearerToken reads "Authorization: Bearer <token>"; the scheme is
// case-insensitive (RFC 9110 §11.1) and surrounding spaces are not part of
// the token.
func BearerToken(h http.Header) (string, bool) {
	scheme, tok, ok := strings.Cut(h.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// Digest is what a listener keeps of a secret and compares: a SHA-256 is
// of one length whatever the secret's, so a comparison in constant time
// leaks neither its content nor its length.
type Digest [sha256.Size]byte

// DigestOf returns secret's digest.
func DigestOf(secret string) Digest { return sha256.Sum256([]byte(secret)) }

// Matches reports, in constant time, whether got is the secret of d.
func (d Digest) Matches(got string) bool {
	g := DigestOf(got)
	return subtle.ConstantTimeCompare(g[:], d[:]) == 1
}

// Equal compares two secrets in constant time.
func Equal(got, want string) bool { return DigestOf(want).Matches(got) }

// IsLoopback reports whether addr, host:port or a bare host, is a loopback
// IP address. Names ("localhost") are not: a peer address is never one.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
