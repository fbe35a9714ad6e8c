package bench

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/sim"
)

// The prefill/decode benchmark's routers: the split pool's config gives
// each worker its role, the blind one turns prefix matching off, and both
// load and validate as cart would.
func TestPDConfigs(t *testing.T) {
	c := DefaultPD()
	if got := pdRoles("cart-pd", c); !slices.Equal(got, []string{sim.RolePrefill, sim.RolePrefill, sim.RoleDecode, sim.RoleDecode}) {
		t.Fatalf("split roles %v", got)
	}
	c.Prefill, c.Decode = 3, 1
	if got := pdRoles("cart-agg", c); len(got) != 4 || slices.ContainsFunc(got, func(r string) bool { return r != "" }) {
		t.Fatalf("whole roles %v", got)
	}
	workers := []string{"http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3", "http://127.0.0.1:4"}
	for _, blind := range []bool{false, true} {
		text := CartConfig(CartRouterConfig{Port: 6700, Workers: workers, Roles: pdRoles("blind-pd", c), CacheTokens: 40960, Blind: blind})
		path := filepath.Join(t.TempDir(), "cart.yaml")
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Load(path)
		if err != nil {
			t.Fatalf("%v\n%s", err, text)
		}
		cfg.Server.MinOpenFiles = 0
		if err := cfg.Validate(config.RoleAllInOne); err != nil {
			t.Fatal(err)
		}
		var roles []string
		for _, w := range cfg.Workers {
			roles = append(roles, w.Role)
		}
		if strings.Join(roles, ",") != "prefill,prefill,prefill,decode" {
			t.Errorf("roles %v", roles)
		}
		if off := cfg.Cache.Threshold == 1 && cfg.Cache.MatchAbsThreshold == 0; off != blind {
			t.Errorf("blind %v: threshold %v, match_abs_threshold %d", blind, cfg.Cache.Threshold, cfg.Cache.MatchAbsThreshold)
		}
	}
}
