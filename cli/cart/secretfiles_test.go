package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/internal/testkit/proc"
	"github.com/cartrouter/cart/sim"
	"github.com/cartrouter/cart/sim/simtest"
)

// Attack #9 of issue 33 on the real binary: a client key file anyone can
// read. The router warns at start (naming the key, the file and the fix)
// and --config-check warns too; with auth.refuse_insecure_secret_files it
// refuses to start, and --config-check fails the same way. With the flag on
// and the file private, it serves and idles past several index maintenance
// passes and health rounds without a word about it.
func TestSecretFilePermissions(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the cart binary")
	}
	bin := proc.Build(t, ".")
	rep := simtest.URLs(t, 1, func(int) sim.Config { return sim.Config{Name: "r"} })[0]
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "client-key")
	if err := os.WriteFile(keyFile, []byte("tenant-key-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(keyFile, 0o644); err != nil {
		t.Fatal(err)
	}
	port := testkit.FreePort(t)
	cfgPath := filepath.Join(dir, "cart.yaml")
	write := func(refuse bool) {
		body := fmt.Sprintf(`server: {host: 127.0.0.1, port: %d, min_open_files: 0}
log: {level: info, format: text}
cache: {eviction_interval_secs: 0.2}
health: {interval_secs: 0.3, timeout_secs: 0.2}
workers: [{url: %s}]
auth:
  refuse_insecure_secret_files: %v
  client_keys: [{name: t1, key_file: %s}]
`, port, rep, refuse, keyFile)
		if err := os.WriteFile(cfgPath, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	const warning = "secret file readable beyond this process's user"

	write(false)
	r := proc.Run(t, proc.Cmd{Path: bin, Args: []string{"-c", cfgPath, "--config-check"}})
	if r.Code != 0 || !strings.Contains(r.Stderr, "warning: auth.client_keys[0].key_file: "+keyFile+" is readable by group or others (mode 0644)") {
		t.Errorf("--config-check with a 0644 key file: exit %d\n%s", r.Code, r.Output)
	}
	p := proc.Start(t, proc.Cmd{Name: "warn", Path: bin, Args: []string{"-c", cfgPath}})
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	p.WaitFor(t, 10*time.Second, "/health", proc.HTTPOK(base+"/health"))
	p.WaitLog(t, 5*time.Second, warning)
	if !p.Log.Contains("key=auth.client_keys[0].key_file file="+keyFile) || !p.Log.Contains("chmod 600") {
		t.Errorf("the warning does not name the key, the file and the fix:\n%s", p.Log.String())
	}
	p.Terminate()

	write(true)
	for _, args := range [][]string{{"--config-check"}, nil} {
		r := proc.Run(t, proc.Cmd{Path: bin, Args: append([]string{"-c", cfgPath}, args...)})
		if r.Code == 0 || !strings.Contains(r.Output, "auth.client_keys[0].key_file: "+keyFile+" is readable by group or others") ||
			!strings.Contains(r.Output, "refuse_insecure_secret_files is on") {
			t.Errorf("cart %v with the flag and a 0644 key file: exit %d\n%s", args, r.Code, r.Output)
		}
	}

	if err := os.Chmod(keyFile, 0o600); err != nil {
		t.Fatal(err)
	}
	q := proc.Start(t, proc.Cmd{Name: "strict", Path: bin, Args: []string{"-c", cfgPath}})
	q.WaitFor(t, 10*time.Second, "/health", proc.HTTPOK(base+"/health"))
	idlePastMaintenance(t, q, base+"/metrics", 1500*time.Millisecond) // and five health rounds
	q.WaitFor(t, 5*time.Second, "/health after idling", proc.HTTPOK(base+"/health"))
	if !q.Running() || q.Log.Contains(warning) {
		t.Errorf("strict router with a private key file: running %v\n%s", q.Running(), q.Log.String())
	}
}
