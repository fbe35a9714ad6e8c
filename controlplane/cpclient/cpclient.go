// Package cpclient builds the HTTP client every caller of the control-plane
// API uses (data planes, cartctl, followers forwarding to the leader): HTTP/2
// over TLS when a CA or client certificate is configured, HTTP/2 with prior
// knowledge (h2c) otherwise, so gRPC works either way.
package cpclient

import (
	"crypto/tls"
	"net"
	"net/http"
	"time"

	"github.com/cartrouter/cart/config"
)

// New returns an HTTP/2 client for the control-plane API.
func New(c config.ClientTLS) (*http.Client, error) {
	tc, err := c.Config()
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
