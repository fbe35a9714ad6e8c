package config

import (
	"bytes"
	"fmt"
	"math"
	"reflect"

	"go.yaml.in/yaml/v3"
)

// Redacted replaces secrets in YAML output.
const Redacted = "<redacted>"

// YAML renders the effective configuration, with every key present, for
// `--config-check`. Inline tokens are replaced by Redacted so the output can
// be pasted into tickets; token file paths are kept because they are not
// secret and are what an operator needs to check. Apart from tokens, loading
// the output yields an equal Config.
func (c *Config) YAML() ([]byte, error) {
	out := *c
	out.origins = nil
	if out.Auth.Token != "" {
		out.Auth.Token = Redacted
	}
	if out.Auth.AdminToken != "" {
		out.Auth.AdminToken = Redacted
	}
	if out.Auth.RaftToken != "" {
		out.Auth.RaftToken = Redacted
	}
	if len(out.Auth.ClientKeys) > 0 {
		// A fresh slice: out shares the caller's backing array.
		keys := make([]ClientKey, len(out.Auth.ClientKeys))
		for i, k := range out.Auth.ClientKeys {
			if k.Key != "" {
				k.Key = Redacted
			}
			keys[i] = k
		}
		out.Auth.ClientKeys = keys
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&out); err != nil {
		return nil, fmt.Errorf("rendering config as YAML: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("rendering config as YAML: %w", err)
	}
	return buf.Bytes(), nil
}

// DiffKeys returns the dotted keys whose values differ between a and b, in
// schema order. Mappings are compared leaf by leaf; lists, including
// "workers", are compared as a whole because they are replaced as a whole
// when layering. An empty and a missing list are equal, as are two NaNs. A
// nil config is treated as Default().
//
// SIGHUP reload uses it to refuse changes other than "workers", which is the
// only setting that can be applied to a running process.
func DiffKeys(a, b *Config) []string {
	if a == nil {
		a = Default()
	}
	if b == nil {
		b = Default()
	}
	var keys []string
	diffStruct("", reflect.ValueOf(a).Elem(), reflect.ValueOf(b).Elem(), &keys)
	return keys
}

func diffStruct(prefix string, a, b reflect.Value, keys *[]string) {
	t := a.Type()
	for i := 0; i < t.NumField(); i++ {
		name := yamlName(t.Field(i))
		if name == "" {
			continue
		}
		key := joinKey(prefix, name)
		av, bv := a.Field(i), b.Field(i)
		if av.Kind() == reflect.Struct {
			diffStruct(key, av, bv, keys)
			continue
		}
		if !leafEqual(av, bv) {
			*keys = append(*keys, key)
		}
	}
}

func leafEqual(a, b reflect.Value) bool {
	switch a.Kind() {
	case reflect.Slice:
		if a.Len() == 0 && b.Len() == 0 {
			return true
		}
		return reflect.DeepEqual(a.Interface(), b.Interface())
	case reflect.Float32, reflect.Float64:
		x, y := a.Float(), b.Float()
		return x == y || (math.IsNaN(x) && math.IsNaN(y))
	default:
		return reflect.DeepEqual(a.Interface(), b.Interface())
	}
}
