package index

import (
	"maps"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
)

// Retiring a worker and purging in steps ends where RemoveWorker ends:
// the same holders, the same LRU order, every release reported once, also
// with a frozen view alive (the purge copies the pages it writes and the
// view keeps what it saw) and with entries inserted between steps.
func TestRetireAndPurgeMatchRemoveWorker(t *testing.T) {
	for _, frozen := range []bool{false, true} {
		build := func() *Index {
			x := New(Options{MaxEntries: 5000})
			insertShortPaths(x, 3, 600)
			return x
		}
		want, got := build(), build()
		var wantRel, gotRel []uint64
		want.OnRelease(func(h uint64, w WorkerID) {
			if w == 2 {
				wantRel = append(wantRel, h)
			}
		})
		got.OnRelease(func(h uint64, w WorkerID) {
			if w != 2 {
				t.Fatalf("released a holding of worker %d", w)
			}
			gotRel = append(gotRel, h)
		})
		var v *View
		var seen map[uint64]map[WorkerID]int64
		if frozen {
			v = got.Freeze()
			seen = walkHolders(t, v)
		}
		want.RemoveWorker(2)
		got.RetireWorker(2)
		if got.Retiring() != 1 {
			t.Fatalf("retiring %d", got.Retiring())
		}
		steps := 0
		for !got.PurgeStep(7) {
			steps++
			if steps == 3 { // a new entry mid-purge, held by a live worker
				got.Insert([]uint64{0xfeed}, 1, 1000)
				want.Insert([]uint64{0xfeed}, 1, 1000)
			}
		}
		if steps < 10 {
			t.Fatalf("purge took %d steps of 7 slots over %d slots: not bounded", steps, got.nslots)
		}
		checkInvariants(t, got)
		if got.Retiring() != 0 {
			t.Fatal("retired set not forgotten after a full pass")
		}
		if !maps.EqualFunc(holdersOf(got), holdersOf(want), maps.Equal) {
			t.Fatalf("frozen=%v: purge and RemoveWorker disagree", frozen)
		}
		if !slices.Equal(lruOrder(got), lruOrder(want)) {
			t.Fatalf("frozen=%v: LRU order differs", frozen)
		}
		if len(gotRel) != len(wantRel) {
			t.Fatalf("frozen=%v: %d releases, want %d", frozen, len(gotRel), len(wantRel))
		}
		if v != nil {
			if after := walkHolders(t, v); !maps.EqualFunc(after, seen, maps.Equal) {
				t.Fatal("the purge wrote through into a frozen view")
			}
			v.Release()
		}
	}
}

// Clear forgets a pending purge.
func TestClearForgetsRetired(t *testing.T) {
	x := New(Options{MaxEntries: 100})
	x.Insert([]uint64{1, 2, 3}, 5, 1)
	x.RetireWorker(5)
	x.Clear()
	if x.Retiring() != 0 || !x.PurgeStep(1) {
		t.Fatal("a cleared index still purges")
	}
}

func holdersOf(x *Index) map[uint64]map[WorkerID]int64 {
	out := map[uint64]map[WorkerID]int64{}
	x.Walk(func(h uint64, _ int64, hs []Holder) bool { out[h] = holderMap(hs); return true })
	return out
}

func walkHolders(t *testing.T, v *View) map[uint64]map[WorkerID]int64 {
	t.Helper()
	out := map[uint64]map[WorkerID]int64{}
	if err := v.Walk(func(h uint64, _ int64, hs []Holder) bool { out[h] = holderMap(hs); return true }); err != nil {
		t.Fatal(err)
	}
	return out
}

// BenchmarkRemoveWorker compares removing one of eight workers from a full
// 1M-entry index at once (one lock hold) with one purge step of the
// maintenance loop (2,048 slots), in CPU time of the thread.
func BenchmarkRemoveWorker(b *testing.B) {
	b.Run("at-once", func(b *testing.B) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var total time.Duration
		for b.Loop() {
			b.StopTimer()
			x := fillIndex(Options{MaxEntries: 1_000_000}, 1_000_000, 100, 8, 5)
			settle()
			b.StartTimer()
			cpu := testkit.ThreadCPU()
			x.RemoveWorker(3)
			total += testkit.ThreadCPU() - cpu
		}
		b.ReportMetric(float64(total.Microseconds())/float64(b.N), "cpu-µs/hold")
	})
	b.Run("purge-step", func(b *testing.B) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		x := fillIndex(Options{MaxEntries: 1_000_000}, 1_000_000, 100, 8, 5)
		settle()
		var total, worst time.Duration
		for b.Loop() {
			if x.Retiring() == 0 {
				b.StopTimer()
				x = fillIndex(Options{MaxEntries: 1_000_000}, 1_000_000, 100, 8, 5)
				x.RetireWorker(3)
				settle()
				b.StartTimer()
			}
			cpu := testkit.ThreadCPU()
			x.PurgeStep(2048)
			d := testkit.ThreadCPU() - cpu
			total, worst = total+d, max(worst, d)
		}
		b.ReportMetric(float64(total.Microseconds())/float64(b.N), "cpu-µs/hold")
		b.ReportMetric(float64(worst.Microseconds()), "max-cpu-µs")
	})
}
