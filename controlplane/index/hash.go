package index

import "github.com/cespare/xxhash/v2"

// Hash cuts text into blocks of blockChars bytes and appends one chained
// 64-bit hash per block to dst: block i's hash covers blocks 0..i, and the
// chain is seeded with the model name, so the same text sent to two models
// never shares a prefix. The final partial block is hashed too, so a short
// prompt still matches an identical earlier one exactly.
//
// Data planes and the control plane must compute identical hashes, so this
// function is the wire format of a prefix: change it only with a new
// protocol version.
func Hash(dst []uint64, model string, text []byte, blockChars int) []uint64 {
	if blockChars <= 0 {
		panic("index: blockChars must be positive")
	}
	var d xxhash.Digest
	seed := xxhash.Sum64String(model)
	for off := 0; off < len(text); off += blockChars {
		end := min(off+blockChars, len(text))
		d.ResetWithSeed(seed)
		_, _ = d.Write(text[off:end])
		seed = d.Sum64()
		dst = append(dst, seed)
	}
	return dst
}

// NumBlocks is the number of hashes Hash produces for n bytes of text.
func NumBlocks(n, blockChars int) int {
	return (n + blockChars - 1) / blockChars
}

// MatchedChars converts a matched block count into the number of key
// characters those blocks cover (the last block may be partial).
func MatchedChars(blocks, keyLen, blockChars int) int {
	return min(blocks*blockChars, keyLen)
}
