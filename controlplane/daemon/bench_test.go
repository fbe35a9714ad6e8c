package daemon_test

// BenchmarkPlaceBatchApply: engine-lock hold time of one placement batch,
// in process. The control-plane load generator (three processes, Route
// load, CPU per route, decide and lock-hold percentiles, failover) is
// `cart-bench cp` and `cart-bench failover` (bench/README.md).
//
//	go test -run XXX -bench PlaceBatchApply -benchtime 200x ./controlplane/daemon

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
	"github.com/cartrouter/cart/controlplane/state"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

const (
	benchWorkers     = 4
	benchGroups      = 100
	benchBlockChars  = 128 // cache.block_chars default: the nodes run config.Default()
	benchPrefixChars = 2048
	benchMinChars    = 2500
	benchMaxChars    = 10000
	benchModel       = "bench-model"
)

// ---- workload ---------------------------------------------------------

// workload yields Route requests: prompts of 2.5k-10k characters, each
// starting with one of 100 shared 2 k-character group prefixes (a system
// prompt, a few-shot preamble) followed by a unique suffix. The prefix
// hashes come from index.Hash over real text; the suffix hashes are a
// chain of unique 64-bit values (the control plane only ever sees hashes,
// so their text does not matter, and generating 6 kB of text per request
// would cost the load generator more than the server).
type workload struct {
	prefixes [][]uint64
	salt     uint64
	seq      atomic.Uint64
}

func newWorkload() *workload {
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	w := &workload{salt: r.Uint64()}
	text := make([]byte, benchPrefixChars)
	const letters = "abcdefghijklmnopqrstuvwxyz      ,.ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	for range benchGroups {
		for i := range text {
			text[i] = letters[r.IntN(len(letters))]
		}
		w.prefixes = append(w.prefixes, index.Hash(nil, benchModel, text, benchBlockChars))
	}
	return w
}

func mix64(x uint64) uint64 { // splitmix64 finaliser
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// next returns a fresh request (a unique prompt) for data plane dp.
func (w *workload) next(dp string) *cartv1.RouteRequest {
	n := w.seq.Add(1)
	r := mix64(n ^ w.salt)
	g := w.prefixes[r%benchGroups]
	keyLen := benchMinChars + int((r>>16)%(benchMaxChars-benchMinChars+1))
	blocks := index.NumBlocks(keyLen, benchBlockChars)
	hashes := make([]uint64, blocks)
	copy(hashes, g)
	h := g[len(g)-1]
	for i := len(g); i < blocks; i++ {
		h = mix64(h ^ mix64(n*0x100000001b3+uint64(i)) ^ w.salt)
		hashes[i] = h
	}
	return &cartv1.RouteRequest{
		Endpoint:    "chat_completions",
		Model:       benchModel,
		BlockHashes: hashes,
		KeyLength:   uint32(keyLen),
		DataplaneId: dp,
		RequestId:   strconv.FormatUint(n, 36),
	}
}

// BenchmarkPlaceBatchApply times State.Apply of one PlaceBatch log entry
// as the placement batcher produces it (k placements of the unique suffix
// of a workload prompt, ~66 hashes each). Apply holds the engine lock,
// shared with Route, for the whole entry, so ns/op is how long every Route
// on that node waits behind one batch. "leader" applies placements the
// engine already inserted at Route time (what the leader does with its own
// batches); "follower" inserts them fresh. "full" starts with the index at
// its ceiling (max_tree_size + 1/8 headroom, the control plane's state
// after a few minutes: nothing evicts it). Run with a fixed count, e.g.
// -benchtime 300x: every iteration builds its batch untimed.
func BenchmarkPlaceBatchApply(b *testing.B) {
	cfg := config.Default()
	for _, fill := range []string{"empty", "full"} {
		for _, role := range []string{"follower", "leader"} {
			for _, k := range []int{50, 512} {
				b.Run(fmt.Sprintf("%s/%s/k=%d", fill, role, k), func(b *testing.B) {
					dec := decider.New(decider.Options{Policy: decider.PolicyFrom(cfg), MaxEntries: cfg.Cache.MaxTreeSize,
						InlineEvict: cfg.Cache.EvictionIntervalSecs <= 0, Rand: rand.New(rand.NewPCG(1, 2))})
					st := state.New(dec)
					// The benchmark fills and pre-places untimed, inside the
					// decider's critical section like every index change.
					var idx *index.Index
					dec.Do(decider.OpRead, func(e *engine.Engine) { idx = e.Index() })
					locked := func(fn func()) { dec.Do(decider.OpRead, func(*engine.Engine) { fn() }) }
					set := &cartv1.SetWorkersCommand{}
					for w := range benchWorkers {
						set.Workers = append(set.Workers, &cartv1.WorkerSpec{Url: fmt.Sprintf("http://w%d", w)})
					}
					data, err := state.Encode(&cartv1.RaftCommand{Body: &cartv1.RaftCommand_SetWorkers{SetWorkers: set}})
					if err != nil {
						b.Fatal(err)
					}
					if _, err := st.Apply(1, data); err != nil {
						b.Fatal(err)
					}
					wl := newWorkload()
					now := time.Now().UnixNano()
					if fill == "full" {
						locked(func() {
							ceiling := cfg.Cache.MaxTreeSize + cfg.Cache.MaxTreeSize/8
							for i := 0; idx.Len() < ceiling && i < 10_000_000; i++ {
								idx.Insert(wl.next("fill").BlockHashes, index.WorkerID(i%benchWorkers), now)
							}
						})
					}
					hashes := 0
					b.ResetTimer()
					for i := range b.N {
						b.StopTimer()
						batch := &cartv1.PlaceBatchCommand{}
						for j := range k {
							h := wl.next("b").BlockHashes
							w := j % benchWorkers
							if role == "leader" {
								locked(func() { idx.Insert(h, index.WorkerID(w), now) })
							}
							batch.Placements = append(batch.Placements, &cartv1.Placement{Worker: fmt.Sprintf("http://w%d", w), BlockHashes: h[benchPrefixChars/benchBlockChars:], AtUnixNanos: now})
							hashes += len(h) - benchPrefixChars/benchBlockChars
						}
						data, err := state.Encode(&cartv1.RaftCommand{Ignorable: true, Body: &cartv1.RaftCommand_PlaceBatch{PlaceBatch: batch}})
						if err != nil {
							b.Fatal(err)
						}
						b.StartTimer()
						if _, err := st.Apply(uint64(i+2), data); err != nil {
							b.Fatal(err)
						}
					}
					b.StopTimer()
					b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(hashes), "ns/hash")
					b.ReportMetric(float64(dec.Stats().IndexEntries), "index-entries")
				})
			}
		}
	}
}
