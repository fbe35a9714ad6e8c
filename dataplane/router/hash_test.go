package router

import (
	"bytes"
	"slices"
	"testing"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
)

func TestHashMatchesIndexAndStopsAtRouteDepth(t *testing.T) {
	const bc = 64
	short := []byte("system prompt, then a question")
	if got, want := Hash(nil, "m", "", short, bc), index.Hash(nil, "m", short, bc); !slices.Equal(got, want) {
		t.Errorf("short key: %x, want the index's chain %x", got, want)
	}
	if got, want := Hash(nil, "m", "salt", short, bc), index.HashSalted(nil, "m", "salt", short, bc); !slices.Equal(got, want) {
		t.Errorf("salted key: %x, want the index's salted chain %x", got, want)
	}

	long := bytes.Repeat([]byte("0123456789abcdef"), (engine.MaxRouteBlocks+3)*bc/16+5)
	got := Hash(nil, "m", "", long, bc)
	if len(got) != engine.MaxRouteBlocks {
		t.Fatalf("long key: %d hashes, want %d (the depth a decision looks)", len(got), engine.MaxRouteBlocks)
	}
	if full := index.Hash(nil, "m", long, bc); !slices.Equal(got, full[:engine.MaxRouteBlocks]) {
		t.Error("long key: the hashes are not the first blocks of the full chain")
	}
	dst := make([]uint64, 0, 4)
	if out := Hash(dst, "m", "", short, bc); &out[0] != &dst[:1][0] {
		t.Error("Hash did not append to dst's storage")
	}
}
