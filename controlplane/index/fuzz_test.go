package index

import (
	"fmt"
	"maps"
	"slices"
	"testing"
)

// refIndex is a deliberately naive model of Index: a map of entries with a
// global touch counter standing in for the LRU list (eviction = smallest
// tick, found by scanning).
type refIndex struct {
	m       map[uint64]*refEntry
	tick    uint64
	ceiling int
	inline  bool
	evicted uint64
	skipped uint64
}

type refEntry struct {
	holders map[WorkerID]int64
	used    int64
	tick    uint64
}

func (r *refIndex) touch(h uint64, w WorkerID, now int64) {
	e := r.m[h]
	if e == nil {
		e = &refEntry{holders: map[WorkerID]int64{}}
		r.m[h] = e
	}
	r.tick++
	e.tick, e.used, e.holders[w] = r.tick, now, now
}

func (r *refIndex) oldest() (uint64, *refEntry) {
	var bh uint64
	var be *refEntry
	for h, e := range r.m {
		if be == nil || e.tick < be.tick {
			bh, be = h, e
		}
	}
	return bh, be
}

func (r *refIndex) evictOldest() {
	h, _ := r.oldest()
	delete(r.m, h)
	r.evicted++
}

func (r *refIndex) insert(p []uint64, w WorkerID, now int64) int {
	skipped := 0
	if !r.inline {
		// Store the shallowest new blocks that fit; cut the path at the
		// first one that does not.
		room := r.ceiling - len(r.m)
		cut := len(p)
		for i, h := range p {
			if r.m[h] != nil {
				continue
			}
			if cut == len(p) && room > 0 {
				room--
				continue
			}
			if cut == len(p) {
				cut = i
			}
			skipped++
		}
		p = p[:cut]
	}
	protected := false
	for i := len(p) - 1; i >= 0; i-- {
		if r.m[p[i]] == nil && len(r.m) >= r.ceiling {
			if !protected {
				// The leading run of present blocks is moved out of
				// the eviction's way, leaf first.
				n := 0
				for n < i && r.m[p[n]] != nil {
					n++
				}
				for j := n - 1; j >= 0; j-- {
					r.tick++
					r.m[p[j]].tick = r.tick
				}
				protected = true
			}
			r.evictOldest()
		}
		r.touch(p[i], w, now)
	}
	r.skipped += uint64(skipped)
	return skipped
}

func (r *refIndex) removeHolder(p []uint64, w WorkerID) {
	for _, h := range p {
		if e := r.m[h]; e != nil {
			delete(e.holders, w)
			if len(e.holders) == 0 {
				delete(r.m, h)
			}
		}
	}
}

func (r *refIndex) lookup(p []uint64) (map[WorkerID]int, int) {
	out, longest := map[WorkerID]int{}, 0
	for i, h := range p {
		e := r.m[h]
		if e == nil {
			break
		}
		for w := range e.holders {
			out[w] = i + 1
		}
		longest = i + 1
	}
	return out, longest
}

// compare checks that x and r hold exactly the same entries, holders,
// times and LRU order.
func (r *refIndex) compare(x *Index) error {
	if err := invariantErr(x); err != nil {
		return err
	}
	if x.Len() != len(r.m) {
		return fmt.Errorf("Len %d, model %d", x.Len(), len(r.m))
	}
	withHolders := 0
	for _, e := range r.m {
		if len(e.holders) > 0 {
			withHolders++
		}
	}
	if x.Len() != withHolders {
		return fmt.Errorf("Len %d but %d hashes have a holder", x.Len(), withHolders)
	}
	if x.Len() > r.ceiling {
		return fmt.Errorf("Len %d above ceiling %d", x.Len(), r.ceiling)
	}
	st := x.Stats()
	if st.Evicted != r.evicted || st.SkippedInserts != r.skipped || st.Entries != len(r.m) {
		return fmt.Errorf("stats %+v, model evicted %d skipped %d", st, r.evicted, r.skipped)
	}
	want := slices.Collect(maps.Keys(r.m))
	slices.SortFunc(want, func(a, b uint64) int { return int(r.m[b].tick) - int(r.m[a].tick) })
	var got []uint64
	var err error
	x.Walk(func(h uint64, used int64, hs []Holder) bool {
		got = append(got, h)
		e := r.m[h]
		switch {
		case e == nil:
			err = fmt.Errorf("index holds %#x, model does not", h)
		case used != e.used:
			err = fmt.Errorf("%#x used %d, model %d", h, used, e.used)
		case !maps.Equal(holderMap(hs), e.holders):
			err = fmt.Errorf("%#x holders %v, model %v", h, holderMap(hs), e.holders)
		}
		return err == nil
	})
	if err != nil {
		return err
	}
	if !slices.Equal(got, want) {
		return fmt.Errorf("LRU order %#x, model %#x", got, want)
	}
	return nil
}

// FuzzIndexOps runs a byte-coded sequence of operations against Index and
// the reference model, comparing them after every step.
func FuzzIndexOps(f *testing.F) {
	f.Add([]byte{4, 1, 0, 0, 5, 1, 7, 0, 1, 1, 9, 2, 1, 3, 2, 0, 0})
	f.Add([]byte{2, 0, 1, 0, 3, 0xff, 0, 1, 0, 3, 0xee, 0, 2, 0, 3, 0xdd, 5, 0, 2, 1})
	f.Add([]byte{8, 3, 1, 0, 6, 0x55, 0, 2, 6, 0xaa, 0, 3, 6, 0x12, 2, 1, 2, 0xff, 3, 0, 0, 0, 1, 6, 0x55})
	f.Add([]byte{1, 0, 0, 0, 6, 1, 0, 1, 6, 2, 6, 0, 7, 0, 0, 0, 6, 3})
	f.Add([]byte{16, 4, 0, 0, 2, 9, 0, 1, 4, 9, 0, 2, 6, 9, 3, 1, 1, 2, 6, 9, 4, 3, 5, 0, 0})
	f.Add([]byte{3, 0, 1, 0, 1, 5, 6, 2, 0, 4, 7, 9, 1, 0, 3, 6, 3, 9, 9, 1, 0, 2, 5})
	f.Fuzz(func(t *testing.T, data []byte) {
		next := func() byte {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return b
		}
		o := Options{MaxEntries: 1 + int(next()%24), Headroom: int(next() % 6), InlineEvict: next()%2 == 1}
		x := New(o)
		ref := &refIndex{m: map[uint64]*refEntry{}, ceiling: x.ceiling, inline: o.InlineEvict}
		// path decodes a short text over a 3-letter alphabet (block size 1,
		// so prefixes are shared often), occasionally under another model.
		path := func() []uint64 {
			n, bits := int(next()%8), next()
			text := make([]byte, n)
			for i := range text {
				text[i] = 'a' + (bits>>uint(i))%3
			}
			model := "m"
			if n == 7 {
				model, text = "other", text[:6]
			}
			return Hash(nil, model, text, 1)
		}
		var now int64
		var m Match
		for step := 0; len(data) > 0 && step < 200; step++ {
			op := next() % 10
			switch op {
			case 0, 1, 2: // insert
				w, p := WorkerID(next()%4), path()
				if got, want := x.Insert(p, w, now), ref.insert(p, w, now); got != want {
					t.Fatalf("step %d: Insert skipped %d, model %d", step, got, want)
				}
			case 3: // lookup
				p := path()
				x.Lookup(p, &m)
				want, longest := ref.lookup(p)
				if got := matchMap(t, &m); !maps.Equal(got, want) || m.Longest != longest {
					t.Fatalf("step %d: Lookup %v/%d, model %v/%d", step, got, m.Longest, want, longest)
				}
			case 4: // remove a holder from part of a path (may leave gaps)
				w, p := WorkerID(next()%4), path()
				from := int(next()) % (len(p) + 1)
				x.RemoveHolder(p[from:], w)
				ref.removeHolder(p[from:], w)
			case 5: // remove worker
				w := WorkerID(next() % 4)
				x.RemoveWorker(w)
				for h := range ref.m {
					ref.removeHolder([]uint64{h}, w)
				}
			case 6: // evict
				target, limit := int(next()%24), int(next()%5)
				removed, done := x.Evict(target, limit)
				wantRemoved := 0
				for len(ref.m) > target && (limit <= 0 || wantRemoved < limit) {
					ref.evictOldest()
					wantRemoved++
				}
				if removed != wantRemoved || done != (len(ref.m) <= target) {
					t.Fatalf("step %d: Evict(%d,%d)=%d,%v model %d", step, target, limit, removed, done, wantRemoved)
				}
			case 7: // expire
				cutoff, limit := now-int64(next()%8), int(next()%5)
				removed, done := x.ExpireBefore(cutoff, limit)
				wantRemoved, wantDone := 0, true
				for len(ref.m) > 0 {
					if _, e := ref.oldest(); e.used >= cutoff {
						break
					}
					if limit > 0 && wantRemoved >= limit {
						wantDone = false
						break
					}
					ref.evictOldest()
					wantRemoved++
				}
				if removed != wantRemoved || done != wantDone {
					t.Fatalf("step %d: ExpireBefore(%d,%d)=%d,%v model %d,%v", step, cutoff, limit, removed, done, wantRemoved, wantDone)
				}
			case 8: // time passes
				now += int64(next() % 4)
			case 9:
				switch next() % 8 {
				case 0:
					x.Clear()
					ref.evicted += uint64(len(ref.m))
					clear(ref.m)
				case 1: // snapshot (Walk) and restore (PutBack) into a new index
					x = restore(o, walkAll(x))
					ref.evicted, ref.skipped = 0, 0
				}
			}
			if err := ref.compare(x); err != nil {
				t.Fatalf("step %d (op %d): %v", step, op, err)
			}
		}
	})
}
