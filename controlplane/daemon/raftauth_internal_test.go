package daemon

import (
	"crypto/tls"
	"crypto/x509"
	"strings"
	"testing"

	"github.com/cartrouter/cart/config"
)

// Start refuses an unauthenticated Raft port beyond loopback even for a
// Config built in code (which Validate may never have seen).
func TestCheckRaftAuth(t *testing.T) {
	remote := config.ControlPlane{RaftAddr: "10.0.0.5:6702"}
	advertised := config.ControlPlane{RaftAddr: "127.0.0.1:6702", AdvertiseRaftAddr: "cp-1.internal:6702"}
	optOut := remote
	optOut.AllowUnauthenticatedRaft = true
	mtls := &tls.Config{ClientCAs: x509.NewCertPool()}
	for _, tc := range []struct {
		name   string
		cp     config.ControlPlane
		token  string
		srvTLS *tls.Config
		ok     bool
	}{
		{"loopback", config.ControlPlane{RaftAddr: "127.0.0.1:6702"}, "", nil, true},
		{"remote without auth", remote, "", nil, false},
		{"advertised remote without auth", advertised, "", nil, false},
		{"remote with server-only TLS", remote, "", &tls.Config{}, false},
		{"remote with token", remote, "t", nil, true},
		{"remote with mutual TLS", remote, "", mtls, true},
		{"remote, explicit opt-out", optOut, "", nil, true},
	} {
		err := checkRaftAuth(tc.cp, tc.token, tc.srvTLS)
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.name, err)
		}
		if err != nil && !strings.Contains(err.Error(), "allow_unauthenticated_raft") {
			t.Errorf("%s: error does not name the opt-out: %v", tc.name, err)
		}
	}
}
