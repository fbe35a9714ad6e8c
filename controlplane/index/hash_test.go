package index

import (
	"slices"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// The hash is the wire format shared by data planes and the control plane:
// these vectors must only change with a protocol version bump.
func TestHashGolden(t *testing.T) {
	tests := []struct {
		model string
		text  string
		block int
		want  []uint64
	}{
		{"llama-3", "The quick brown fox jumps over the lazy dog", 16,
			[]uint64{0x1a195e43bd690078, 0xbc987caa4f5976b9, 0x5a95ff450b9ad2a4}},
		{"", "abc", 1, []uint64{0xa68dc19d9effecde, 0x89354878d7eadeb0, 0xe0b03477b23018b2}},
		{"m", "", 4, nil},
	}
	for _, tt := range tests {
		got := Hash(nil, tt.model, []byte(tt.text), tt.block)
		if !slices.Equal(got, tt.want) {
			t.Errorf("Hash(%q, %q, %d) = %#x, want %#x", tt.model, tt.text, tt.block, got, tt.want)
		}
	}
}

// TestHashDefinition recomputes the chain independently: block i is
// XXH64(block_i, seed = hash of block i-1), block -1 being XXH64(model).
func TestHashDefinition(t *testing.T) {
	text := []byte(strings.Repeat("0123456789abcdefghij", 7) + "xyz") // 143 bytes
	for _, bc := range []int{1, 7, 16, 64, 143, 144, 1000} {
		seed := xxhash.Sum64String("model-x")
		var want []uint64
		for off := 0; off < len(text); off += bc {
			d := xxhash.NewWithSeed(seed)
			d.Write(text[off:min(off+bc, len(text))])
			seed = d.Sum64()
			want = append(want, seed)
		}
		got := Hash(nil, "model-x", text, bc)
		if !slices.Equal(got, want) {
			t.Errorf("blockChars=%d: got %#x want %#x", bc, got, want)
		}
		if len(got) != NumBlocks(len(text), bc) {
			t.Errorf("blockChars=%d: %d hashes, NumBlocks says %d", bc, len(got), NumBlocks(len(text), bc))
		}
	}
}

func TestHashProperties(t *testing.T) {
	const bc = 4
	base := "aaaabbbbccccdddd"
	h := hashes(base, bc)
	if len(h) != 4 {
		t.Fatalf("got %d hashes, want 4", len(h))
	}
	if !slices.Equal(h, hashes(base, bc)) {
		t.Fatal("Hash is not deterministic")
	}

	// Chaining: changing block 0 changes every later hash.
	h0 := hashes("Xaaabbbbccccdddd", bc)
	for i := range h {
		if h0[i] == h[i] {
			t.Errorf("changing block 0 left hash %d unchanged", i)
		}
	}
	// Changing block 2 keeps 0 and 1, changes 2 and 3.
	h2 := hashes("aaaabbbbXcccdddd", bc)
	if !slices.Equal(h2[:2], h[:2]) || h2[2] == h[2] || h2[3] == h[3] {
		t.Errorf("changing block 2: got %#x, base %#x", h2, h)
	}
	// Same block contents at different positions hash differently.
	same := hashes("abcdabcdabcd", bc)
	if same[0] == same[1] || same[1] == same[2] {
		t.Errorf("identical blocks at different depths share a hash: %#x", same)
	}

	// Final partial block is hashed; a longer text shares the full blocks
	// only, and an identical short prompt matches exactly.
	p := hashes("aaaabb", bc)
	if len(p) != 2 || p[0] != h[0] || p[1] == h[1] {
		t.Errorf("partial block: got %#x, base %#x", p, h)
	}
	if !slices.Equal(p, hashes("aaaabb", bc)) {
		t.Error("short prompt does not match itself")
	}
	if q := hashes("aaaabbb", bc); q[1] == p[1] {
		t.Error("partial blocks of different length collide")
	}
	one := hashes("a", bc)
	if len(one) != 1 || one[0] == h[0] {
		t.Errorf("single-char text: %#x", one)
	}

	// Model seeds the chain: same text, other model, nothing shared.
	other := Hash(nil, "other-model", []byte(base), bc)
	for i := range h {
		if other[i] == h[i] {
			t.Errorf("model does not seed hash %d", i)
		}
	}
	if slices.Equal(Hash(nil, "", []byte(base), bc), h) {
		t.Error("empty model equals model m")
	}

	// Hash appends to dst.
	dst := []uint64{42}
	dst = Hash(dst, "m", []byte(base), bc)
	if dst[0] != 42 || !slices.Equal(dst[1:], h) {
		t.Errorf("Hash does not append: %#x", dst)
	}
}

func TestHashPanicsOnBadBlockSize(t *testing.T) {
	for _, bc := range []int{0, -1} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("blockChars=%d: no panic", bc)
				}
			}()
			Hash(nil, "m", []byte("x"), bc)
		}()
	}
}

func TestNumBlocks(t *testing.T) {
	tests := []struct{ n, bc, want int }{
		{0, 4, 0}, {1, 4, 1}, {3, 4, 1}, {4, 4, 1}, {5, 4, 2}, {8, 4, 2}, {9, 4, 3},
		{100, 1, 100}, {10_000, 128, 79}, {100_000, 128, 782},
	}
	for _, tt := range tests {
		if got := NumBlocks(tt.n, tt.bc); got != tt.want {
			t.Errorf("NumBlocks(%d,%d)=%d want %d", tt.n, tt.bc, got, tt.want)
		}
	}
}

func TestMatchedChars(t *testing.T) {
	tests := []struct{ blocks, keyLen, bc, want int }{
		{0, 10, 4, 0},
		{1, 10, 4, 4},
		{2, 10, 4, 8},
		{3, 10, 4, 10}, // last block partial
		{3, 12, 4, 12}, // last block full
		{79, 10_000, 128, 10_000},
		{78, 10_000, 128, 9984},
	}
	for _, tt := range tests {
		if got := MatchedChars(tt.blocks, tt.keyLen, tt.bc); got != tt.want {
			t.Errorf("MatchedChars(%d,%d,%d)=%d want %d", tt.blocks, tt.keyLen, tt.bc, got, tt.want)
		}
	}
}

func TestHashAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	text := []byte(strings.Repeat("x", 10_000))
	dst := make([]uint64, 0, NumBlocks(len(text), 128))
	if n := testing.AllocsPerRun(100, func() { dst = Hash(dst[:0], "m", text, 128) }); n != 0 {
		t.Errorf("Hash with a big enough dst allocates %v times", n)
	}
}

// A cache salt separates chains (different salts never share a block),
// keeps equal salts together, and leaves unsalted hashes unchanged.
func TestHashSalted(t *testing.T) {
	text := []byte(strings.Repeat("shared system prompt ", 20))
	plain := Hash(nil, "m", text, 16)
	if got := HashSalted(nil, "m", "", text, 16); !slices.Equal(got, plain) {
		t.Fatal("an empty salt changed the hashes")
	}
	a1 := HashSalted(nil, "m", "tenant-a", text, 16)
	a2 := HashSalted(nil, "m", "tenant-a", text, 16)
	b := HashSalted(nil, "m", "tenant-b", text, 16)
	if !slices.Equal(a1, a2) {
		t.Fatal("the same salt gave different hashes")
	}
	for i := range a1 {
		if a1[i] == b[i] || a1[i] == plain[i] {
			t.Fatalf("block %d shared across salts", i)
		}
	}
	// The seed is the model and salt joined by NUL, as documented.
	if got := Hash(nil, "m\x00tenant-a", text, 16); !slices.Equal(got, a1) {
		t.Fatal("salted seed is not model NUL salt")
	}
	if got := testing.AllocsPerRun(100, func() { a1 = HashSalted(a1[:0], "m", "tenant-a", text, 16) }); got != 0 {
		t.Errorf("HashSalted allocates %v times", got)
	}
}
