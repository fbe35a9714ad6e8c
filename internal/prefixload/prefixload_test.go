package prefixload

import (
	"strings"
	"testing"
)

func TestWorkloadLRU(t *testing.T) {
	w := New(5, 2, 1)
	steps := []struct {
		g           int
		repeat, hit bool
		worker      string
		explanation string
	}{
		{0, false, false, "a", "first sight"},
		{0, true, true, "a", "cached on a"},
		{0, true, false, "b", "not on b"},
		{1, false, false, "a", "a now holds 0, 1"},
		{2, false, false, "a", "evicts 0 from a"},
		{0, true, false, "a", "0 was evicted"},
		{2, true, true, "a", "2 still there"},
	}
	for _, s := range steps {
		if r, h := w.Landed(s.g, s.worker); r != s.repeat || h != s.hit {
			t.Fatalf("%s: repeat %v hit %v", s.explanation, r, h)
		}
	}
	if g, key := w.Next(); !strings.HasPrefix(key, w.Prefix(g)) {
		t.Errorf("key %q does not start with its group", key)
	}
	// Requests share the prefix and nothing after it.
	one := New(1, 1, 2)
	seen := map[string]bool{}
	for range 2000 {
		_, key := one.Next()
		own := key[len(one.Prefix(0)):][:13] // "|" and the first 12 random characters
		if seen[own] {
			t.Fatalf("two requests share %q after the prefix", own)
		}
		seen[own] = true
	}
}
