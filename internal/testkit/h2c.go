package testkit

import (
	"net/http"
	"net/http/httptest"
)

// H2CServer returns a loopback test server for h that speaks HTTP/1 and
// HTTP/2 with prior knowledge (h2c), as gRPC over plaintext needs. It is
// not started, so that a test may read its address first (a node that must
// know its own URL); the test starts and closes it.
func H2CServer(h http.Handler) *httptest.Server {
	srv := httptest.NewUnstartedServer(h)
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv.Config.Protocols = &p
	return srv
}

// H2CClient speaks HTTP/2 with prior knowledge to plaintext servers.
func H2CClient() *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: &p}}
}
