package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
)

// FuzzLoad feeds arbitrary bytes through Load and Validate. Beyond "never
// panic" it checks the properties other packages rely on: failures are
// always *Problems naming the file, and any loadable config survives a
// YAML() round trip (secrets aside).
func FuzzLoad(f *testing.F) {
	f.Add([]byte(readExample(f)))
	for _, seed := range []string{
		"",
		"# only a comment\n",
		"---\n",
		"server:\n  port: abc\n",
		"server:\n  port: [1\n",
		"server:\n\tport: 1\n",
		"servr: {}\n",
		"workers:\n  -\n  - url: http://a:1/\n    maxload: 3\n",
		"workers: &a [*a]\n",
		"server: &s\n  <<: *s\n",
		"workers:\n  - &w {url: \"http://a:1\", max_load: 3}\n  - <<: *w\n    url: http://b:1\n",
		"cache:\n  threshold: .nan\n  ttl_secs: .inf\n",
		"controlplane:\n  snapshot_threshold: -1.0\n  trailing_logs: 1e30\n",
		"a: 1\n---\nb: 2\n",
		"? [a]\n: 1\n",
		"auth:\n  token: \"\\0\\x85\\u2028\"\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "fuzz.yaml")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(path)
		if err != nil {
			var ps *Problems
			if !errors.As(err, &ps) || len(*ps) == 0 {
				t.Fatalf("Load error is not a non-empty *Problems: %T %v", err, err)
			}
			for _, p := range *ps {
				if p.File != path {
					t.Fatalf("problem without the file name: %s", p)
				}
			}
			_ = err.Error()
			return
		}
		for _, role := range []Role{RoleAllInOne, RoleControlPlane, RoleDataPlane} {
			if err := c.Validate(role); err != nil {
				var ps *Problems
				if !errors.As(err, &ps) || len(*ps) == 0 {
					t.Fatalf("Validate error is not a non-empty *Problems: %T %v", err, err)
				}
			}
		}
		out, err := c.YAML()
		if err != nil {
			t.Fatalf("YAML(): %v", err)
		}
		back := filepath.Join(t.TempDir(), "back.yaml")
		if err := os.WriteFile(back, out, 0o600); err != nil {
			t.Fatal(err)
		}
		c2, err := Load(back)
		if err != nil {
			t.Fatalf("rendered YAML does not load: %v\n%s", err, out)
		}
		var diff []string
		for _, k := range DiffKeys(c, c2) {
			if k != "auth.token" && k != "auth.admin_token" && k != "auth.raft_token" {
				diff = append(diff, k)
			}
		}
		if len(diff) > 0 {
			t.Fatalf("round trip changed %v\nrendered:\n%s", diff, out)
		}
		// Normalizing twice must not change anything.
		again := *c2
		again.Workers = append([]Worker(nil), c2.Workers...)
		again.Normalize()
		if !slices.EqualFunc(again.Workers, c2.Workers, func(a, b Worker) bool { return reflect.DeepEqual(a, b) }) {
			t.Fatalf("Normalize is not idempotent: %v → %v", c2.Workers, again.Workers)
		}
	})
}
