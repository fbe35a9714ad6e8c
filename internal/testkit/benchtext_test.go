package testkit

import (
	"math/rand/v2"
	"testing"
)

func TestPrintableText(t *testing.T) {
	a := PrintableText(500, rand.New(rand.NewPCG(1, 2)))
	b := PrintableText(500, rand.New(rand.NewPCG(1, 2)))
	if len(a) != 500 || string(a) != string(b) {
		t.Fatalf("want 500 bytes, the same for the same seed: %q vs %q", a, b)
	}
	for _, c := range a {
		if c < ' ' || c > '~' {
			t.Fatalf("byte %q is not printable ASCII", c)
		}
	}
}

func TestSizeName(t *testing.T) {
	for n, want := range map[int]string{1_000: "1k", 250_000: "250k", 2_000_000: "2M", 999_999: "999k"} {
		if got := SizeName(n); got != want {
			t.Errorf("SizeName(%d) = %q, want %q", n, got, want)
		}
	}
}
