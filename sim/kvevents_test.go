package sim

import (
	"maps"
	"net/http"
	"slices"
	"sync"
	"testing"

	"github.com/cartrouter/cart/kvevents"
)

// recordingSink keeps every published batch.
type recordingSink struct {
	mu      sync.Mutex
	batches [][]kvevents.Event
}

func (r *recordingSink) Publish(events []kvevents.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batches = append(r.batches, slices.Clone(events))
}

func (r *recordingSink) take() [][]kvevents.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.batches
	r.batches = nil
	return out
}

// cacheContent is the set of hashes the replica's cache holds.
func cacheContent(s *Server) map[uint64]bool {
	s.cache.mu.Lock()
	defer s.cache.mu.Unlock()
	out := make(map[uint64]bool, len(s.cache.blocks))
	for h := range s.cache.blocks {
		out[h] = true
	}
	return out
}

// apply plays events on a consumer's view of the cache, checking what a
// consumer relies on: a stored run's parent is held, removed blocks were.
func apply(t *testing.T, view map[uint64]bool, batches [][]kvevents.Event) {
	t.Helper()
	for _, b := range batches {
		for _, ev := range b {
			switch ev.Kind {
			case kvevents.BlockStored:
				if ev.ParentBlockHash != nil && !view[*ev.ParentBlockHash] {
					t.Fatalf("stored run's parent %x is not held", *ev.ParentBlockHash)
				}
				if len(ev.TokenIDs) != len(ev.BlockHashes)*ev.BlockSize || ev.Medium != kvevents.MediumGPU {
					t.Fatalf("stored event %+v", ev)
				}
				for _, h := range ev.BlockHashes {
					view[h] = true
				}
			case kvevents.BlockRemoved:
				for _, h := range ev.BlockHashes {
					if !view[h] {
						t.Fatalf("removed block %x was not held", h)
					}
					delete(view, h)
				}
			case kvevents.AllBlocksCleared:
				clear(view)
			}
		}
	}
}

func TestKVEventsDescribeTheCache(t *testing.T) {
	sink := &recordingSink{}
	s, ts := startReplica(t, Config{CacheTokens: 4 * 16, KVEvents: sink})

	complete(t, ts, pathCompletions, tokenPrompt(seq(0, 40)))
	got := sink.take()
	if len(got) != 1 || len(got[0]) != 1 {
		t.Fatalf("first prompt published %+v", got)
	}
	first := got[0][0]
	if first.Kind != kvevents.BlockStored || len(first.BlockHashes) != 2 || first.ParentBlockHash != nil || first.BlockSize != 16 || first.LoRAName != "" {
		t.Fatalf("first event %+v", first)
	}
	// Token-id prompts are published with their own ids.
	if !slices.Equal(first.TokenIDs, toUint32(seq(0, 32))) {
		t.Fatalf("token ids %v", first.TokenIDs)
	}

	complete(t, ts, pathCompletions, tokenPrompt(seq(0, 56)))
	got = sink.take()
	if len(got) != 1 || got[0][0].Kind != kvevents.BlockStored || len(got[0][0].BlockHashes) != 1 ||
		got[0][0].ParentBlockHash == nil || *got[0][0].ParentBlockHash != first.BlockHashes[1] ||
		!slices.Equal(got[0][0].TokenIDs, toUint32(seq(32, 16))) {
		t.Fatalf("extension published %+v", got)
	}
	complete(t, ts, pathCompletions, tokenPrompt(seq(0, 56))) // all cached: nothing changes
	if got := sink.take(); len(got) != 0 {
		t.Fatalf("a full hit published %+v", got)
	}

	view := make(map[uint64]bool)
	apply(t, view, [][]kvevents.Event{{first}})
	apply(t, view, got)
	if want := cacheContent(s); !maps.Equal(view, want) {
		t.Fatalf("the events say %v, the cache holds %v", view, want)
	}

	// Under pressure, prompts sharing prefixes with evictions in between:
	// the consumer's view must match the cache after every request.
	removals := 0
	for i, ids := range [][]int{seq(1000, 40), seq(0, 20), seq(2000, 70), seq(1000, 60), seq(5, 33)} {
		complete(t, ts, pathCompletions, tokenPrompt(ids))
		batches := sink.take()
		for _, b := range batches {
			for _, ev := range b {
				if ev.Kind == kvevents.BlockRemoved {
					removals++
				}
			}
		}
		apply(t, view, batches)
		if want := cacheContent(s); !maps.Equal(view, want) {
			t.Fatalf("after request %d the events say %v, the cache holds %v", i, view, want)
		}
	}

	if removals == 0 {
		t.Fatal("the workload evicted nothing; it tests nothing")
	}

	resp, _ := mustPost(t, ts, "/sim/reset", "")
	if resp.StatusCode != http.StatusOK {
		t.Fatal(resp.Status)
	}
	if got := sink.take(); len(got) != 1 || len(got[0]) != 1 || got[0][0].Kind != kvevents.AllBlocksCleared {
		t.Fatalf("reset published %+v", got)
	}
}

func TestKVEventsNameTheAdapter(t *testing.T) {
	sink := &recordingSink{}
	_, ts := startReplica(t, Config{KVEvents: sink, LoRAModules: []LoRAModule{{Name: "sql", Path: "/sql"}}})
	body := tokenPrompt(seq(0, 16))
	body["model"] = "sql"
	complete(t, ts, pathCompletions, body)
	got := sink.take()
	if len(got) != 1 || got[0][0].LoRAName != "sql" {
		t.Fatalf("adapter request published %+v", got)
	}
}

func TestTokenIDsPadThePartialToken(t *testing.T) {
	if got := tokenIDs([]byte{1, 0, 0, 0, 2}, 0, 3); !slices.Equal(got, []uint32{1, 2, 0}) {
		t.Fatalf("token ids %v", got)
	}
}

func toUint32(ids []int) []uint32 {
	out := make([]uint32, len(ids))
	for i, id := range ids {
		out[i] = uint32(id)
	}
	return out
}
