// Package enginetest renders an engine's prefix index for the tests of the
// packages that replicate it (state, raftnode, service): replicas number
// their workers in their own order, so they compare holders by URL.
package enginetest

import (
	"cmp"
	"slices"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
)

// Holder is one holder of an index entry.
type Holder struct {
	URL string
	At  int64 // when it was placed or last confirmed
}

// Entry is one index entry: its last use and its holders, by URL.
type Entry struct {
	Used    int64
	Holders []Holder
}

// Entries walks eng's prefix index; the caller holds the lock that guards
// eng. Each entry's holders are sorted by URL, then time.
func Entries(eng *engine.Engine) map[uint64]Entry {
	out := map[uint64]Entry{}
	eng.Index().Walk(func(hash uint64, used int64, holders []index.Holder) bool {
		hs := make([]Holder, 0, len(holders))
		for _, h := range holders {
			url, _ := eng.WorkerURL(uint32(h.Worker))
			hs = append(hs, Holder{URL: url, At: h.At})
		}
		slices.SortFunc(hs, func(a, b Holder) int { return cmp.Or(cmp.Compare(a.URL, b.URL), cmp.Compare(a.At, b.At)) })
		out[hash] = Entry{Used: used, Holders: hs}
		return true
	})
	return out
}
