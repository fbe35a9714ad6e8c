package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runCart(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	root := newRoot()
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), errb.String(), err
}

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// --config-check lists every problem of every file in one run, each with
// file, line and key.
func TestConfigCheckListsEveryProblem(t *testing.T) {
	base := writeFile(t, "base.yaml", "workers:\n  - url: http://127.0.0.1:8001\ncache:\n  treshold: 0.5\n  block_chars: 0\n")
	overlay := writeFile(t, "overlay.yaml", "server:\n  port: 99999\n")
	_, stderr, err := runCart(t, "-c", base, "-c", overlay, "--config-check")
	if err == nil {
		t.Fatal("invalid config passed the check")
	}
	for _, want := range []string{
		base + ":4: cache.treshold: unknown key",
		base + ":5: cache.block_chars",
		overlay + ":2: server.port",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("check output lacks %q:\n%s", want, stderr)
		}
	}
}

func TestConfigCheckPrintsEffectiveConfig(t *testing.T) {
	// A config the router would start with: on loopback, since it has no
	// client keys, and within this machine's open-files limit.
	base := writeFile(t, "base.yaml", "workers:\n  - url: http://127.0.0.1:8001\nserver: {host: 127.0.0.1, min_open_files: 0}\n")
	overlay := writeFile(t, "overlay.yaml", "# only a comment\n")
	out, _, err := runCart(t, "-c", base, "-c", overlay, "--config-check")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "url: http://127.0.0.1:8001") || !strings.Contains(out, "threshold: 0.3") {
		t.Fatalf("effective config not printed:\n%s", out)
	}
}

func TestEmptyWorkersRefused(t *testing.T) {
	cfg := writeFile(t, "c.yaml", "workers: []\n")
	_, _, err := runCart(t, "-c", cfg)
	if err == nil || !strings.Contains(err.Error(), "at least one worker is required") {
		t.Fatalf("empty worker list: %v", err)
	}
}

func TestVersion(t *testing.T) {
	out, _, err := runCart(t, "--version")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, "cart ") || !strings.Contains(out, "commit ") || !strings.Contains(out, "go1.") {
		t.Fatalf("version output %q", out)
	}
}

// A secret file that is missing or empty fails --config-check for every
// role, with the file and key named, instead of starting without auth.
func TestConfigCheckRefusesMissingSecretFiles(t *testing.T) {
	empty := writeFile(t, "empty", "\n")
	for _, tc := range []struct {
		args []string
		body string
		want string
	}{
		{nil, "workers: [{url: http://127.0.0.1:8001}]\nauth: {token_file: /nonexistent/cart-token}\n", "auth.token_file"},
		{[]string{"dataplane"}, "dataplane: {control_plane: [http://127.0.0.1:6701]}\nauth: {token_file: /nonexistent/cart-token}\n", "auth.token_file"},
		{[]string{"controlplane"}, "controlplane: {node_id: n1, data_dir: /tmp/x}\nauth: {admin_token_file: /nonexistent/admin}\n", "auth.admin_token_file"},
		{nil, "workers: [{url: http://127.0.0.1:8001}]\nauth: {client_keys: [{name: a, key_file: " + empty + "}]}\n", "auth.client_keys[0].key_file"},
	} {
		cfg := writeFile(t, "c.yaml", tc.body)
		_, stderr, err := runCart(t, append(tc.args, "-c", cfg, "--config-check")...)
		if err == nil || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v %q: err %v, stderr %q; want %s reported", tc.args, tc.body, err, stderr, tc.want)
		}
	}
}

// `cart controlplane migrate-log` runs the migration on the config's data
// dir: one without a bolt log is refused with the reason.
func TestMigrateLogNeedsABoltLog(t *testing.T) {
	dir := t.TempDir()
	cfg := writeFile(t, "cp.yaml", "controlplane: {node_id: n1, data_dir: "+dir+"}\n")
	_, _, err := runCart(t, "controlplane", "migrate-log", "-c", cfg)
	if err == nil || !strings.Contains(err.Error(), "holds no bolt log") {
		t.Fatalf("migrate-log on an empty data dir: %v, want nothing to migrate", err)
	}
}
