package deploy

import (
	"strings"
	"testing"

	"github.com/cartrouter/cart/config"
)

// TestLocalRunShipsWithAClientKey: `make run` is what newcomers copy, so it
// demonstrates client authentication: run.sh creates the key file the
// config names and prints it in the curl line.
func TestLocalRunShipsWithAClientKey(t *testing.T) {
	cfg, err := config.Load(path(t, "deploy", "local", "cart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Auth.ClientKeys) != 1 || cfg.Auth.ClientKeys[0].KeyFile == "" {
		t.Fatalf("client_keys %v: want one key read from a file", cfg.Auth.ClientKeys)
	}
	keyFile := cfg.Auth.ClientKeys[0].KeyFile
	run := string(readFile(t, "deploy", "local", "run.sh"))
	if !strings.Contains(run, "key_file="+keyFile) || !strings.Contains(run, `-H "Authorization: Bearer $key"`) {
		t.Errorf("run.sh does not create %s or does not print the key in the curl line", keyFile)
	}
	withSecretFiles(cfg, fakeSecrets(t))
	if err := cfg.Validate(config.RoleAllInOne); err != nil {
		t.Fatal(err)
	}
}

// TestLocalRunSplit: `make run SPLIT=1` starts the replicas its config
// names, with their roles, and the layered config is valid.
func TestLocalRunSplit(t *testing.T) {
	cfg, err := config.Load(path(t, "deploy", "local", "cart.yaml"), path(t, "deploy", "local", "cart-split.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	run := string(readFile(t, "deploy", "local", "run.sh"))
	for _, w := range cfg.Workers {
		port := w.URL[strings.LastIndexByte(w.URL, ':')+1:]
		if w.Role != "prefill" && w.Role != "decode" {
			t.Errorf("%s: role %q", w.URL, w.Role)
		}
		if !strings.Contains(run, `--listen "127.0.0.1:800$i"`) || !strings.Contains(run, "--pd-role") || !strings.HasPrefix(port, "800") {
			t.Errorf("run.sh does not start %s as a %s replica", w.URL, w.Role)
		}
	}
	if len(cfg.Workers) != 4 || !strings.Contains(run, "for i in 1 2 3 4") || !strings.Contains(run, "deploy/local/cart-split.yaml") {
		t.Errorf("workers %v; run.sh must start four replicas and layer cart-split.yaml", cfg.Workers)
	}
	withSecretFiles(cfg, fakeSecrets(t))
	if err := cfg.Validate(config.RoleAllInOne); err != nil {
		t.Fatal(err)
	}
}
