// Package cpclient builds the HTTP client every caller of the control-plane
// API uses (data planes, cartctl, followers forwarding to the leader): HTTP/2
// over TLS when a CA or client certificate is configured, HTTP/2 with prior
// knowledge (h2c) otherwise, so gRPC works either way.
package cpclient

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/cartrouter/cart/config"
)

// TLSConfig turns client TLS settings into a tls.Config (nil when none are
// set, meaning plaintext h2c).
func TLSConfig(c config.ClientTLS) (*tls.Config, error) {
	if c.CAFile == "" && c.CertFile == "" && c.ServerName == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("read CA %s: %w", c.CAFile, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA %s: no certificates found", c.CAFile)
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

// New returns an HTTP/2 client for the control-plane API.
func New(c config.ClientTLS) (*http.Client, error) {
	tc, err := TLSConfig(c)
	if err != nil {
		return nil, err
	}
	return NewWithTLS(tc), nil
}

// NewWithTLS returns an HTTP/2 client; tc nil means h2c.
func NewWithTLS(tc *tls.Config) *http.Client {
	d := &net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}
	t := &http.Transport{
		DialContext:         d.DialContext,
		TLSClientConfig:     tc,
		TLSHandshakeTimeout: 2 * time.Second,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   true,
	}
	var p http.Protocols
	if tc == nil {
		p.SetUnencryptedHTTP2(true)
	} else {
		p.SetHTTP2(true)
	}
	t.Protocols = &p
	return &http.Client{Transport: t}
}
