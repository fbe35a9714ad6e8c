package router

import (
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
)

// Hash appends the block hashes of a request's key text to dst, as
// Request.Hashes carries them: seeded with the model and, when set, the
// request's cache_salt. Only the blocks a decision can use are hashed (the
// engine looks at most engine.MaxRouteBlocks deep): hashing, and in a data
// plane sending, the rest of a long prompt would be wasted. The proxy
// hashes through here so the index's layout stays the routing core's.
func Hash(dst []uint64, model, salt string, key []byte, blockChars int) []uint64 {
	if lim := engine.MaxRouteBlocks * blockChars; len(key) > lim {
		key = key[:lim]
	}
	return index.HashSalted(dst, model, salt, key, blockChars)
}

// CharsPerToken is the index's characters-per-token assumption
// (index.CharsPerToken), for the proxy's token estimates.
const CharsPerToken = index.CharsPerToken
