package config

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cartrouter/cart/internal/testkit"
)

func TestTLSServerConfig(t *testing.T) {
	dir := t.TempDir()
	cert, key := testkit.NewCA(t).WritePEM(t, dir)
	empty := filepath.Join(dir, "empty.pem")
	if err := os.WriteFile(empty, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	tc, err := TLS{CertFile: cert, KeyFile: key}.ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	if len(tc.Certificates) != 1 || tc.ClientCAs != nil || tc.ClientAuth != tls.NoClientCert || tc.MinVersion != tls.VersionTLS12 {
		t.Errorf("plain TLS: got %d certs, ClientCAs %v, ClientAuth %v, MinVersion %x", len(tc.Certificates), tc.ClientCAs, tc.ClientAuth, tc.MinVersion)
	}

	tc, err = TLS{CertFile: cert, KeyFile: key, ClientCAFile: cert}.ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	if tc.ClientCAs == nil || tc.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Errorf("mutual TLS: ClientCAs %v, ClientAuth %v; want a pool and RequireAndVerifyClientCert", tc.ClientCAs, tc.ClientAuth)
	}

	for name, c := range map[string]TLS{
		"missing key":    {CertFile: cert, KeyFile: filepath.Join(dir, "nope.pem")},
		"missing CA":     {CertFile: cert, KeyFile: key, ClientCAFile: filepath.Join(dir, "nope.pem")},
		"CA without PEM": {CertFile: cert, KeyFile: key, ClientCAFile: empty},
	} {
		if _, err := c.ServerConfig(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := (TLS{CertFile: cert, KeyFile: key, ClientCAFile: empty}).ServerConfig(); err == nil || !strings.Contains(err.Error(), "no certificates found") {
		t.Errorf("CA without certificates: %v, want it named", err)
	}
}

func TestClientTLSConfig(t *testing.T) {
	dir := t.TempDir()
	cert, key := testkit.NewCA(t).WritePEM(t, dir)

	if tc, err := (ClientTLS{}).Config(); err != nil || tc != nil {
		t.Errorf("no settings: %v, %v; want nil (plaintext h2c)", tc, err)
	}
	tc, err := ClientTLS{CAFile: cert, CertFile: cert, KeyFile: key, ServerName: "cp.internal"}.Config()
	if err != nil {
		t.Fatal(err)
	}
	if tc.RootCAs == nil || len(tc.Certificates) != 1 || tc.ServerName != "cp.internal" || tc.MinVersion != tls.VersionTLS12 {
		t.Errorf("got RootCAs %v, %d certs, ServerName %q, MinVersion %x", tc.RootCAs, len(tc.Certificates), tc.ServerName, tc.MinVersion)
	}
	if tc, err := (ClientTLS{ServerName: "cp.internal"}).Config(); err != nil || tc == nil || tc.RootCAs != nil {
		t.Errorf("server name only: %v, %v; want TLS with the system roots", tc, err)
	}
	if _, err := (ClientTLS{CAFile: filepath.Join(dir, "nope.pem")}).Config(); err == nil {
		t.Error("missing CA file: no error")
	}
	if _, err := (ClientTLS{CertFile: cert, KeyFile: filepath.Join(dir, "nope.pem")}).Config(); err == nil {
		t.Error("missing client key: no error")
	}
}
