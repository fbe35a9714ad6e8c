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
