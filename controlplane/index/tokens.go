package index

// CharsPerToken is how many characters of key text the index counts as one
// token. Worker cache capacities are configured, and usage is reported, in
// tokens while the index counts characters; until it is token-aware this
// one figure (the usual 4 characters of English text) converts both ways,
// so a prediction and the capacity it is judged against agree.
const CharsPerToken = 4

// CapacityBlocks converts a prefix-cache capacity in tokens into index
// blocks of blockChars characters: 0 (unbounded) when either is not
// positive, and at least one block otherwise.
func CapacityBlocks(tokens int64, blockChars int) int {
	if tokens <= 0 || blockChars <= 0 {
		return 0
	}
	return int(max(1, tokens*CharsPerToken/int64(blockChars)))
}
