package testkit

import (
	"crypto/tls"
	"crypto/x509"
	"testing"
)

func TestCAIssuesVerifiableCertificates(t *testing.T) {
	ca := NewCA(t)
	leaf := ca.Issue(t, "n1")
	cert, err := x509.ParseCertificate(leaf.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	opts := x509.VerifyOptions{Roots: ca.Pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	if _, err := cert.Verify(opts); err != nil {
		t.Fatalf("issued certificate does not verify against the CA: %v", err)
	}
	if err := cert.VerifyHostname("127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	if _, err := NewCA(t).Cert.Verify(x509.VerifyOptions{Roots: ca.Pool}); err == nil {
		t.Fatal("another CA's certificate verified")
	}
}

func TestCAWritePEMLoads(t *testing.T) {
	ca := NewCA(t)
	certFile, keyFile := ca.WritePEM(t, t.TempDir())
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool, DNSName: "localhost"}); err != nil {
		t.Fatalf("written certificate does not serve localhost as its own CA: %v", err)
	}
}
