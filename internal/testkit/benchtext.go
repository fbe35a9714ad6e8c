package testkit

import (
	"fmt"
	"math/rand/v2"
)

// PrintableText is n bytes of printable ASCII drawn from r: prompt text for
// benchmarks, where only its length and its randomness matter.
func PrintableText(n int, r *rand.Rand) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = ' ' + byte(r.IntN(95))
	}
	return b
}

// SizeName is a benchmark's name for a count: "250k", "2M".
func SizeName(n int) string {
	if n >= 1_000_000 {
		return fmt.Sprintf("%dM", n/1_000_000)
	}
	return fmt.Sprintf("%dk", n/1_000)
}
