package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// The one place certificates and CA pools are read: listeners (API, proxy,
// Raft), control-plane clients and the container probe all load TLS through
// these, so a rule about it (minimum version, an empty CA file being an
// error rather than "trust nothing") holds everywhere at once.

// ServerConfig loads a listener's certificate and, when ClientCAFile is
// set, the CA pool clients must present a certificate from (mutual TLS).
func (t TLS) ServerConfig() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("load TLS key pair %s: %w", t.CertFile, err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if t.ClientCAFile != "" {
		pool, err := CertPool(t.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("client CA: %w", err)
		}
		tc.ClientCAs = pool
		tc.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

// Config turns client TLS settings into a tls.Config; nil when none are
// set, which callers take as plaintext (h2c).
func (c ClientTLS) Config() (*tls.Config, error) {
	if c.CAFile == "" && c.CertFile == "" && c.ServerName == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
	if c.CAFile != "" {
		pool, err := CertPool(c.CAFile)
		if err != nil {
			return nil, err
		}
		tc.RootCAs = pool
	}
	if c.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("load client certificate %s: %w", c.CertFile, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// CertPool reads a PEM file of CA certificates. A file without any is an
// error: an empty pool would make every peer fail verification, far from
// the cause.
func CertPool(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read CA %s: %w", file, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA %s: no certificates found", file)
	}
	return pool, nil
}
