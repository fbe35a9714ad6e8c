package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cartrouter/cart/internal/testkit"
)

// Every refusal a role's start makes before it serves (other than binding
// its ports) is one --config-check makes too, in the same words: each
// config here fails the check, and the start with it fails naming the same
// key.
func TestConfigCheckRefusesWhatStartRefuses(t *testing.T) {
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	noCerts := file("no-certs.pem", "not a certificate\n")
	kubeconfig := file("kubeconfig", "this: [is not a kubeconfig\n")
	boltDir := filepath.Join(dir, "bolt-node")
	if err := os.MkdirAll(boltDir, 0o700); err != nil {
		t.Fatal(err)
	}
	file("bolt-node/raft.db", "")
	missing := filepath.Join(dir, "missing.pem")

	// Each case is a base config a role starts with plus an overlay (a
	// second -c file) that breaks it.
	aio := fmt.Sprintf("workers: [{url: \"http://127.0.0.1:8001\"}]\nserver: {host: 127.0.0.1, port: %d, min_open_files: 0}\n", testkit.FreePort(t))
	dp := fmt.Sprintf("dataplane: {control_plane: [\"http://127.0.0.1:6701\"]}\nserver: {host: 127.0.0.1, port: %d, min_open_files: 0}\n", testkit.FreePort(t))
	cp := func(dataDir string) string {
		return fmt.Sprintf("controlplane: {node_id: n1, api_addr: %q, raft_addr: %q, data_dir: %q, bootstrap: true}\n",
			testkit.FreeAddr(t), testkit.FreeAddr(t), dataDir)
	}
	for _, base := range []string{aio, dp, cp(filepath.Join(dir, "ok"))} {
		var role []string
		switch {
		case strings.HasPrefix(base, "dataplane"):
			role = []string{"dataplane"}
		case strings.HasPrefix(base, "controlplane"):
			role = []string{"controlplane"}
		}
		if _, stderr, err := runCart(t, append(role, "-c", file("base.yaml", base), "--config-check")...); err != nil {
			t.Fatalf("%v base config refused: %s", role, stderr)
		}
	}
	const anyHost = "server: {host: 0.0.0.0}\n"
	serverTLS := fmt.Sprintf("server: {tls: {cert_file: %q, key_file: %q}}\n", missing, missing)
	tracing := fmt.Sprintf("tracing: {otlp_endpoint: \"https://127.0.0.1:4318\", ca_file: %q}\n", noCerts)
	clientTLS := fmt.Sprintf("dataplane: {control_plane: [\"http://127.0.0.1:6701\"], tls: {ca_file: %q}}\n", missing)
	kube := fmt.Sprintf("discovery: {kubernetes: {enabled: true, service: vllm, port: http, kubeconfig: %q}}\n", kubeconfig)

	clientTLS = strings.Replace(clientTLS, "control_plane: [\"http://127.0.0.1:6701\"], ", "", 1)
	type tc struct {
		name          string
		args          []string
		base, overlay string
		key           string // the problem's key, in both outputs
	}
	cpArgs, dpArgs := []string{"controlplane"}, []string{"dataplane"}
	cases := []tc{
		{"all-in-one on 0.0.0.0 without client keys", nil, aio, anyHost, "server.host"},
		{"data plane on 0.0.0.0 without client keys", dpArgs, dp, anyHost, "server.host"},
		{"all-in-one server.tls unreadable", nil, aio, serverTLS, "server.tls"},
		{"data plane server.tls unreadable", dpArgs, dp, serverTLS, "server.tls"},
		{"control plane server.tls unreadable", cpArgs, cp(filepath.Join(dir, "n1")), serverTLS, "server.tls"},
		{"all-in-one tracing.ca_file without certificates", nil, aio, tracing, "tracing"},
		{"data plane tracing.ca_file without certificates", dpArgs, dp, tracing, "tracing"},
		{"control plane tracing.ca_file without certificates", cpArgs, cp(filepath.Join(dir, "n2")), tracing, "tracing"},
		{"data plane dataplane.tls unreadable", dpArgs, dp, clientTLS, "dataplane.tls"},
		{"control plane dataplane.tls unreadable", cpArgs, cp(filepath.Join(dir, "n3")), clientTLS, "dataplane.tls"},
		{"control plane raft_tls unreadable", cpArgs, cp(filepath.Join(dir, "n4")),
			fmt.Sprintf("auth: {token: t-1}\ncontrolplane: {raft_tls: {cert_file: %q, key_file: %q}}\n", missing, missing), "controlplane.raft_tls"},
		{"all-in-one kubeconfig unreadable", nil, aio, kube, "discovery"},
		{"control plane kubeconfig unreadable", cpArgs, cp(filepath.Join(dir, "n5")), kube, "discovery"},
		{"control plane data dir holding the other log", cpArgs, cp(boltDir), "controlplane: {log_store: wal}\n", "controlplane.data_dir"},
		{"control plane data dir under a file", cpArgs, cp(filepath.Join(noCerts, "n6")), "", "controlplane.data_dir"},
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Max < math.MaxInt32 {
		over := fmt.Sprintf("server: {min_open_files: %d}\n", lim.Max+1)
		cases = append(cases,
			tc{"all-in-one min_open_files above the hard limit", nil, aio, over, "server.min_open_files"},
			tc{"data plane min_open_files above the hard limit", dpArgs, dp, over, "server.min_open_files"})
	} else {
		t.Logf("hard open-files limit %d: min_open_files above it is not tested", lim.Max)
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := append(c.args, "-c", file(fmt.Sprintf("c%d.yaml", i), c.base), "-c", file(fmt.Sprintf("o%d.yaml", i), c.overlay))
			_, stderr, err := runCart(t, append(args, "--config-check")...)
			if err == nil || !strings.Contains(stderr, c.key+": ") {
				t.Errorf("--config-check: err %v, stderr %q; want %s refused", err, stderr, c.key)
			}
			_, _, err = runCart(t, args...)
			if err == nil || !strings.Contains(err.Error(), c.key) {
				t.Errorf("start: %v; want %s refused", err, c.key)
			}
		})
	}
}
