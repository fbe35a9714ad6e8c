package config

import (
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// examplePath is the documented-defaults file users read; these tests keep
// it from drifting away from Default() and the schema.
var examplePath = filepath.Join("..", "config.example.yaml")

func readExample(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestExampleMatchesDefaults(t *testing.T) {
	c, err := Load(examplePath)
	if err != nil {
		t.Fatalf("Load(%s): %v", examplePath, err)
	}
	if got := DiffKeys(Default(), c); !reflect.DeepEqual(got, []string{"workers", "auth.client_keys"}) {
		t.Errorf("%s differs from Default() in %v (only workers and auth.client_keys may differ)", examplePath, got)
	}
	if len(c.Workers) == 0 {
		t.Errorf("%s should show an example workers list", examplePath)
	}
	if len(c.Auth.ClientKeys) == 0 || c.Auth.ClientKeys[0].KeyFile == "" {
		t.Errorf("%s should show a client key read from a file", examplePath)
	}
	// The example's key file lives on a server, not here: stand one in.
	keyFile := filepath.Join(t.TempDir(), "team-a")
	if err := os.WriteFile(keyFile, []byte("example-key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range c.Auth.ClientKeys {
		c.Auth.ClientKeys[i].KeyFile = keyFile
	}
	if err := c.Validate(RoleAllInOne); err != nil {
		t.Errorf("%s does not validate: %v", examplePath, err)
	}
}

// schemaKeys lists every dotted key of t, with list items written as
// "workers[].url".
func schemaKeys(t reflect.Type, prefix string) []string {
	var keys []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name := yamlName(f)
		if name == "" {
			continue
		}
		key := joinKey(prefix, name)
		keys = append(keys, key)
		switch {
		case f.Type.Kind() == reflect.Struct:
			keys = append(keys, schemaKeys(f.Type, key)...)
		case f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct:
			keys = append(keys, schemaKeys(f.Type.Elem(), key+"[]")...)
		}
	}
	return keys
}

// documentKeys lists the dotted keys present in a YAML mapping, in the same
// notation as schemaKeys, and the leaf keys that lack a comment.
func documentKeys(n *yaml.Node, prefix string, keys map[string]bool, uncommented *[]string) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			documentKeys(c, prefix, keys, uncommented)
		}
	case yaml.SequenceNode:
		for _, c := range n.Content {
			documentKeys(c, prefix+"[]", keys, uncommented)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			key := joinKey(prefix, k.Value)
			isFirstOfListItem := i == 0 && strings.HasSuffix(prefix, "[]")
			if v.Kind != yaml.MappingNode && k.HeadComment == "" && !isFirstOfListItem {
				*uncommented = append(*uncommented, key)
			}
			keys[key] = true
			documentKeys(v, key, keys, uncommented)
		}
	}
}

func TestExampleDocumentsEveryKey(t *testing.T) {
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(readExample(t)), &doc); err != nil {
		t.Fatal(err)
	}
	present := make(map[string]bool)
	var uncommented []string
	documentKeys(&doc, "", present, &uncommented)

	want := schemaKeys(reflect.TypeOf(Config{}), "")
	var missing []string
	for _, k := range want {
		if !present[k] {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		t.Errorf("%s does not document: %s", examplePath, strings.Join(missing, ", "))
	}
	sort.Strings(uncommented)
	// Keys of the second and later example workers are deliberately terse.
	var bad []string
	for _, k := range uncommented {
		if !strings.HasPrefix(k, "workers[]") {
			bad = append(bad, k)
		}
	}
	if len(bad) > 0 {
		t.Errorf("%s has keys without an explaining comment: %s", examplePath, strings.Join(bad, ", "))
	}
	if len(want) < 90 {
		t.Errorf("schemaKeys found only %d keys; the walk is broken", len(want))
	}
}
