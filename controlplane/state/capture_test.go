package state

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/index"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
)

// A snapshot taken while placements, withdrawals, refreshes and eviction
// keep changing the index (on another goroutine, as raft writes it out
// while applies go on) restores to exactly the state at capture time.
func TestSnapshotWhileInsertsContinueRestoresCaptureTime(t *testing.T) {
	src, srcEng := newTestState()
	a := &testApplier{t: t, st: src}
	workers := []string{"http://w0:1", "http://w1:1", "http://w2:1", "http://w3:1"}
	a.apply(setWorkers(workers...))
	r := rand.New(rand.NewPCG(4, 4))
	var paths [][]uint64
	batch := func(n int) *cartv1.RaftCommand {
		var ps, ws []*cartv1.Placement
		for range n {
			var p []uint64
			if len(paths) > 0 && r.IntN(3) == 0 {
				// Refresh (or extend) a known path, often by another worker:
				// entries with several holders, rewritten in place.
				old := paths[r.IntN(len(paths))]
				p = append(p, old[:1+r.IntN(min(len(old), 20))]...)
			}
			for range 1 + r.IntN(20) {
				p = append(p, r.Uint64())
			}
			paths = append(paths, p)
			ps = append(ps, &cartv1.Placement{Worker: workers[r.IntN(len(workers))], BlockHashes: p, AtUnixNanos: int64(len(paths))})
			if r.IntN(8) == 0 {
				old := paths[r.IntN(len(paths))]
				ws = append(ws, &cartv1.Placement{Worker: workers[r.IntN(len(workers))], BlockHashes: old})
			}
		}
		return &cartv1.RaftCommand{Body: &cartv1.RaftCommand_PlaceBatch{PlaceBatch: &cartv1.PlaceBatchCommand{Placements: ps, Withdrawals: ws}}}
	}
	for range 40 {
		a.apply(batch(50))
	}
	want := fingerprint(src, srcEng)
	snap := src.Capture()

	var wg sync.WaitGroup
	var applied atomic.Int64
	stop := make(chan struct{})
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			a.apply(batch(20))
			if i%5 == 0 {
				locked(src, func() { srcEng.Index().Evict(srcEng.Index().Len()-100, 0) })
			}
			applied.Add(1)
		}
	})
	// At least one change lands after the capture, whatever the scheduler
	// does; more run while the snapshot is written.
	testkit.WaitFor(t, 10*time.Second, "a batch applied after the capture", func() bool { return applied.Load() > 0 })
	var buf bytes.Buffer
	err := snap.Write(&buf)
	close(stop)
	wg.Wait()
	snap.Release()
	if err != nil {
		t.Fatal(err)
	}
	if fingerprint(src, srcEng) == want {
		t.Fatal("nothing changed the index while the snapshot was written: the test proves nothing")
	}
	dst, dstEng := newTestState()
	if err := dst.Restore(&buf); err != nil {
		t.Fatal(err)
	}
	if got := fingerprint(dst, dstEng); got != want {
		t.Fatalf("restored state differs from the state at capture time:\n got %.300s\nwant %.300s", got, want)
	}
}

// A snapshot holds no copy of the index: once released it cannot be
// written (its pages may have been reused in place), and says so.
func TestReleasedSnapshotRefusesToWrite(t *testing.T) {
	src, _ := newTestState()
	a := &testApplier{t: t, st: src}
	a.apply(setWorkers("http://w0:1"))
	a.apply(placeBatch(&cartv1.Placement{Worker: "http://w0:1", BlockHashes: []uint64{1, 2, 3}, AtUnixNanos: 1}))
	snap := src.Capture()
	snap.Release()
	if err := snap.Write(&bytes.Buffer{}); !errors.Is(err, index.ErrReleased) {
		t.Fatalf("Write after Release: %v, want ErrReleased", err)
	}
}
