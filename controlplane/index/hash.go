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
	return hashChain(dst, xxhash.Sum64String(model), text, blockChars)
}

// HashSalted is Hash for a request carrying vLLM's cache_salt: the chain is
// seeded with model + "\x00" + salt, so requests with different salts never
// share a prefix (the engine isolates their caches) and requests with the
// same salt do. An empty salt gives exactly Hash's chain, so requests
// without one keep the hashes they always had.
func HashSalted(dst []uint64, model, salt string, text []byte, blockChars int) []uint64 {
	if salt == "" {
		return Hash(dst, model, text, blockChars)
	}
	if blockChars <= 0 {
		panic("index: blockChars must be positive")
	}
	// Streaming the seed's parts equals hashing their concatenation,
	// without building it.
	d := xxhash.New()
	_, _ = d.WriteString(model)
	_, _ = d.WriteString("\x00")
	_, _ = d.WriteString(salt)
	return hashChain(dst, d.Sum64(), text, blockChars)
}

func hashChain(dst []uint64, seed uint64, text []byte, blockChars int) []uint64 {
	var d xxhash.Digest
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
