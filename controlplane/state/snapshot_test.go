package state

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/engine/enginetest"
	"github.com/cartrouter/cart/controlplane/index"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
)

// newTestState returns the state and its decider's engine, which tests
// touch only inside locked (as the state does inside Decider.Do).
func newTestState() (*State, *engine.Engine) {
	dec := decider.New(decider.Options{Policy: engine.Policy{BlockChars: 64, Threshold: 0.3, BalanceAbsThreshold: 64, BalanceRelThreshold: 1.5},
		MaxEntries: 1 << 20, Rand: rand.New(rand.NewPCG(1, 2))})
	var eng *engine.Engine
	dec.Do(decider.OpRead, func(e *engine.Engine) { eng = e })
	return New(dec), eng
}

// locked runs fn inside the state's decider's critical section.
func locked(st *State, fn func()) { st.dec.Do(decider.OpRead, func(*engine.Engine) { fn() }) }

type testApplier struct {
	t  testing.TB
	st *State
	i  uint64
}

func (a *testApplier) apply(cmd *cartv1.RaftCommand) Result {
	a.t.Helper()
	b, err := Encode(cmd)
	if err != nil {
		a.t.Fatal(err)
	}
	a.i++
	res, err := a.st.Apply(a.i, b)
	if err != nil {
		a.t.Fatalf("apply %d: %v", a.i, err)
	}
	return res
}

func setWorkers(urls ...string) *cartv1.RaftCommand {
	var ws []*cartv1.WorkerSpec
	for i, u := range urls {
		ws = append(ws, &cartv1.WorkerSpec{Url: u, MaxLoad: uint32(i), LoadPenalty: 1, CacheCapacityTokens: int64(1000 * (i + 1))})
	}
	return &cartv1.RaftCommand{Body: &cartv1.RaftCommand_SetWorkers{SetWorkers: &cartv1.SetWorkersCommand{Workers: ws}}}
}

func placeBatch(ps ...*cartv1.Placement) *cartv1.RaftCommand {
	return &cartv1.RaftCommand{Body: &cartv1.RaftCommand_PlaceBatch{PlaceBatch: &cartv1.PlaceBatchCommand{Placements: ps}}}
}

// fingerprint is an order-insensitive rendering of a state, holders named
// by URL (index worker ids are local to an engine).
func fingerprint(st *State, eng *engine.Engine) string {
	ws, ver := st.Workers()
	var b strings.Builder
	fmt.Fprintf(&b, "v%d %v %v\n", ver, ws, st.Members())
	var lines []string
	var entries map[uint64]enginetest.Entry
	locked(st, func() { entries = enginetest.Entries(eng) })
	for hash, e := range entries {
		lines = append(lines, fmt.Sprintf("%x %d %v", hash, e.Used, e.Holders))
	}
	slices.Sort(lines)
	b.WriteString(strings.Join(lines, "\n"))
	return b.String()
}

// lookupByURL is a Lookup with holders named by URL.
func lookupByURL(st *State, eng *engine.Engine, hashes []uint64) map[string]int {
	out := map[string]int{}
	locked(st, func() {
		var m index.Match
		eng.Index().Lookup(hashes, &m)
		for i, w := range m.Workers {
			u, _ := eng.WorkerURL(uint32(w))
			out[u] = m.Blocks[i]
		}
	})
	return out
}

// A snapshot of a full-size index (a million entries) round-trips: same
// entry count, same holders on sampled lookups, same worker set; and the
// capture is a copy, unaffected by applies made before it is written.
func TestLargeSnapshotRoundTrip(t *testing.T) {
	paths, blocks := 10_000, 100
	if raceEnabled {
		paths = 2_000 // 200k entries: the race detector slows the index ~10x
	}
	src, srcEng := newTestState()
	a := &testApplier{t: t, st: src}
	workers := []string{"http://w0:1", "http://w1:1", "http://w2:1", "http://w3:1", "http://w4:1", "http://w5:1", "http://w6:1", "http://w7:1"}
	// Capacities far above what the test places: followers apply placements
	// through each worker's capacity model, and this test keeps them all.
	big := setWorkers(workers...)
	for _, w := range big.GetSetWorkers().GetWorkers() {
		w.CacheCapacityTokens <<= 14
	}
	a.apply(big)
	a.apply(&cartv1.RaftCommand{Body: &cartv1.RaftCommand_SetMember{SetMember: &cartv1.SetMemberCommand{NodeId: "n1", ApiUrl: "http://n1:9000"}}})

	r := rand.New(rand.NewPCG(9, 9))
	all := make([][]uint64, paths)
	start := time.Now()
	const perBatch = 100
	for i := 0; i < paths; i += perBatch {
		var ps []*cartv1.Placement
		for j := i; j < min(i+perBatch, paths); j++ {
			all[j] = make([]uint64, blocks)
			for k := range all[j] {
				all[j][k] = r.Uint64()
			}
			ps = append(ps, &cartv1.Placement{Worker: workers[j%len(workers)], BlockHashes: all[j], AtUnixNanos: int64(j)})
			// Every tenth path's prefix also went to another worker: some
			// entries have several holders.
			if j%10 == 0 {
				ps = append(ps, &cartv1.Placement{Worker: workers[(j+1)%len(workers)], BlockHashes: all[j][:blocks/4], AtUnixNanos: int64(j) + 1})
			}
		}
		a.apply(placeBatch(ps...))
	}
	want := paths * blocks
	if n := srcEng.Index().Len(); n != want {
		t.Fatalf("index holds %d entries, want %d", n, want)
	}
	t.Logf("filled %d entries in %v", want, time.Since(start))

	start = time.Now()
	snap := src.Capture()
	t.Logf("capture: %v", time.Since(start))
	// Applies after Capture must not show in the written snapshot.
	a.apply(&cartv1.RaftCommand{Body: &cartv1.RaftCommand_RemoveWorker{RemoveWorker: &cartv1.RemoveWorkerCommand{Url: workers[7]}}})

	var buf bytes.Buffer
	start = time.Now()
	if err := snap.Write(&buf); err != nil {
		t.Fatal(err)
	}
	t.Logf("write: %v, %d bytes (%.1f bytes/entry)", time.Since(start), buf.Len(), float64(buf.Len())/float64(want))

	dst, dstEng := newTestState()
	start = time.Now()
	if err := dst.Restore(&buf); err != nil {
		t.Fatal(err)
	}
	t.Logf("restore: %v", time.Since(start))
	// One hold for the worker set, then one per restoreChunk entries: a
	// single hold for all of them stalled routing for up to a second.
	if got, wantHolds := restoreHolds(t, dst), 1+(want+restoreChunk-1)/restoreChunk; got != wantHolds {
		t.Fatalf("restore took %d lock holds, want %d", got, wantHolds)
	}

	if n := dstEng.Index().Len(); n != want {
		t.Fatalf("restored index holds %d entries, want %d", n, want)
	}
	ws, ver := dst.Workers()
	if len(ws) != len(workers) || ws[7].URL != workers[7] || ws[3].CacheCapacityTokens != 4000<<14 || ws[3].MaxLoad != 3 || ver != 1 {
		t.Fatalf("restored workers %v v%d: want all %d as captured", ws, ver, len(workers))
	}
	if m := dst.Members(); m["n1"] != "http://n1:9000" {
		t.Errorf("members = %v", m)
	}
	for range 200 {
		j := r.IntN(paths)
		want := map[string]int{workers[j%len(workers)]: blocks}
		if j%10 == 0 {
			want[workers[(j+1)%len(workers)]] = blocks / 4
		}
		if got := lookupByURL(dst, dstEng, all[j]); !maps.Equal(got, want) {
			t.Fatalf("path %d: restored lookup %v, want %v", j, got, want)
		}
	}
	// The restored index behaves like the original: routing lands on the
	// holder of the longest prefix.
	var d engine.Decision
	var err error
	locked(dst, func() { d, err = dstEng.Choose(engine.Request{Hashes: all[5], KeyLen: blocks * 64, DryRun: true}, 0) })
	if err != nil || d.Reason != engine.ReasonCacheHit || d.Worker != workers[5] {
		t.Errorf("route on restored engine: %v %v", d, err)
	}
}

// A snapshot that is corrupt anywhere is rejected as a whole: the state it
// was restored onto is left exactly as it was.
func TestRestoreCorruptSnapshotLeavesStateUntouched(t *testing.T) {
	src, _ := newTestState()
	a := &testApplier{t: t, st: src}
	a.apply(setWorkers("http://a:1", "http://b:1"))
	r := rand.New(rand.NewPCG(1, 1))
	for i := range 50 {
		h := []uint64{r.Uint64(), r.Uint64(), r.Uint64()}
		a.apply(placeBatch(&cartv1.Placement{Worker: []string{"http://a:1", "http://b:1"}[i%2], BlockHashes: h, AtUnixNanos: int64(i)}))
	}
	var good bytes.Buffer
	if err := src.Capture().Write(&good); err != nil {
		t.Fatal(err)
	}

	record := func(ms ...proto.Message) []byte {
		var out []byte
		for _, m := range ms {
			b, err := proto.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			out = binary.AppendUvarint(out, uint64(len(b)))
			out = append(out, b...)
		}
		return out
	}
	oneWorker := []*cartv1.WorkerSpec{{Url: "http://x:1"}}
	g := good.Bytes()
	cases := map[string][]byte{
		"empty":               nil,
		"one byte":            g[:1],
		"header only":         g[:len(g)/10],
		"half":                g[:len(g)/2],
		"last byte missing":   g[:len(g)-1],
		"trailing byte":       append(slices.Clone(g), 0),
		"garbage":             bytes.Repeat([]byte{0xff}, 64),
		"huge record length":  binary.AppendUvarint(nil, 1<<40),
		"future version":      record(&cartv1.SnapshotHeader{Version: SnapshotVersion + 1}),
		"version zero":        record(&cartv1.SnapshotHeader{Workers: oneWorker}),
		"holder out of range": record(&cartv1.SnapshotHeader{Version: 1, Workers: oneWorker, IndexRecords: 1}, &cartv1.IndexRecord{Hash: 1, Workers: []uint32{3}, AtUnixNanos: []int64{1}}),
		"holder without time": record(&cartv1.SnapshotHeader{Version: 1, Workers: oneWorker, IndexRecords: 1}, &cartv1.IndexRecord{Hash: 1, Workers: []uint32{0}}),
		"fewer records":       record(&cartv1.SnapshotHeader{Version: 1, Workers: oneWorker, IndexRecords: 2}, &cartv1.IndexRecord{Hash: 1, Workers: []uint32{0}, AtUnixNanos: []int64{1}}),
		"v1 with origins":     record(&cartv1.SnapshotHeader{Version: 1, Workers: oneWorker, OriginRecords: 1}, &cartv1.StoredOrigin{IdHash: 1, Worker: "http://a"}),
	}

	victim, victimEng := newTestState()
	va := &testApplier{t: t, st: victim}
	va.apply(setWorkers("http://v:1"))
	va.apply(placeBatch(&cartv1.Placement{Worker: "http://v:1", BlockHashes: []uint64{7, 8, 9}, AtUnixNanos: 3}))
	before := fingerprint(victim, victimEng)
	for name, bad := range cases {
		if err := victim.Restore(bytes.NewReader(bad)); err == nil {
			t.Errorf("%s: corrupt snapshot accepted", name)
		}
		if got := fingerprint(victim, victimEng); got != before {
			t.Fatalf("%s: failed restore changed the state:\n%s\nwant\n%s", name, got, before)
		}
	}
	// The intact snapshot replaces the state completely.
	if err := victim.Restore(bytes.NewReader(g)); err != nil {
		t.Fatal(err)
	}
	var srcEng *engine.Engine
	src.dec.Do(decider.OpRead, func(e *engine.Engine) { srcEng = e })
	if got, want := fingerprint(victim, victimEng), fingerprint(src, srcEng); got != want {
		t.Fatalf("restored state differs:\n%s\nwant\n%s", got, want)
	}
}

// Restoring onto a state whose workers the snapshot does not have drops
// them and their entries, and keeps nothing of the old index.
func TestRestoreReplacesPreviousState(t *testing.T) {
	src, srcEng := newTestState()
	a := &testApplier{t: t, st: src}
	a.apply(setWorkers("http://a:1"))
	a.apply(placeBatch(&cartv1.Placement{Worker: "http://a:1", BlockHashes: []uint64{1, 2}, AtUnixNanos: 1}))
	var buf bytes.Buffer
	if err := src.Capture().Write(&buf); err != nil {
		t.Fatal(err)
	}

	dst, dstEng := newTestState()
	da := &testApplier{t: t, st: dst}
	da.apply(setWorkers("http://old:1", "http://a:1"))
	da.apply(placeBatch(
		&cartv1.Placement{Worker: "http://old:1", BlockHashes: []uint64{5, 6}, AtUnixNanos: 1},
		&cartv1.Placement{Worker: "http://a:1", BlockHashes: []uint64{1, 2, 3}, AtUnixNanos: 9},
	))
	da.apply(&cartv1.RaftCommand{Body: &cartv1.RaftCommand_SetMember{SetMember: &cartv1.SetMemberCommand{NodeId: "gone", ApiUrl: "x"}}})
	if err := dst.Restore(&buf); err != nil {
		t.Fatal(err)
	}
	if got, want := fingerprint(dst, dstEng), fingerprint(src, srcEng); got != want {
		t.Fatalf("restored state:\n%s\nwant\n%s", got, want)
	}
}

// fakeOrigins records what the state machine does with response origins.
type fakeOrigins struct {
	learned  []*cartv1.ResponseOrigin
	stored   []*cartv1.StoredOrigin
	replaced [][]*cartv1.StoredOrigin
}

func (f *fakeOrigins) Learn(o []*cartv1.ResponseOrigin) { f.learned = append(f.learned, o...) }
func (f *fakeOrigins) Stored() []*cartv1.StoredOrigin   { return f.stored }
func (f *fakeOrigins) Restore(o []*cartv1.StoredOrigin) { f.replaced = append(f.replaced, o) }

// Response origins travel in snapshots: a node restored from one still
// knows which worker stored which response (before, it forgot every id
// made before the snapshot). A corrupt snapshot replaces nothing.
func TestSnapshotCarriesResponseOrigins(t *testing.T) {
	src, _ := newTestState()
	srcO := &fakeOrigins{stored: []*cartv1.StoredOrigin{
		{IdHash: 7, Worker: "http://a:1", ExpiresUnixNanos: 99},
		{IdHash: 8, Worker: "http://b:1", ExpiresUnixNanos: 98},
	}}
	src.SetResponseOrigins(srcO)
	a := &testApplier{t: t, st: src}
	a.apply(setWorkers("http://a:1", "http://b:1"))
	// Index records too, so that the origins' place after them is tested.
	a.apply(placeBatch(&cartv1.Placement{Worker: "http://a:1", BlockHashes: []uint64{1, 2, 3}, AtUnixNanos: 5}))
	var buf bytes.Buffer
	if err := src.Capture().Write(&buf); err != nil {
		t.Fatal(err)
	}
	good := slices.Clone(buf.Bytes())

	dst, _ := newTestState()
	dstO := &fakeOrigins{}
	dst.SetResponseOrigins(dstO)
	if err := dst.Restore(bytes.NewReader(good[:len(good)-1])); err == nil {
		t.Fatal("truncated snapshot restored")
	}
	if len(dstO.replaced) != 0 {
		t.Fatalf("a corrupt snapshot replaced the origins: %v", dstO.replaced)
	}
	dst, dstEng := newTestState()
	dst.SetResponseOrigins(dstO)
	if err := dst.Restore(bytes.NewReader(good)); err != nil {
		t.Fatal(err)
	}
	if n := dstEng.Index().Len(); n != 3 {
		t.Fatalf("restored index holds %d entries, want 3", n)
	}
	if len(dstO.replaced) != 1 || len(dstO.replaced[0]) != 2 ||
		!proto.Equal(dstO.replaced[0][0], srcO.stored[0]) || !proto.Equal(dstO.replaced[0][1], srcO.stored[1]) {
		t.Fatalf("restored origins %v, want %v in order", dstO.replaced, srcO.stored)
	}

	// The origins are records of their own: the header does not grow with
	// them (responses.max_entries of them in the header would outgrow the
	// record size limit, and no node could read the snapshot).
	headerLen := func(stored []*cartv1.StoredOrigin) uint64 {
		srcO.stored = stored
		var b bytes.Buffer
		if err := src.Capture().Write(&b); err != nil {
			t.Fatal(err)
		}
		n, err := binary.ReadUvarint(&b)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	many := make([]*cartv1.StoredOrigin, 10_000)
	for i := range many {
		many[i] = &cartv1.StoredOrigin{IdHash: uint64(i), Worker: "http://a:1", ExpiresUnixNanos: 99}
	}
	// Only their count is in it: a few bytes.
	if none, lots := headerLen(nil), headerLen(many); lots > none+8 {
		t.Fatalf("header of %d bytes with no origins, %d with 10,000", none, lots)
	}
}

// restoreHolds counts the decider's snapshot_restore lock holds.
func restoreHolds(t *testing.T, st *State) int {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(st.dec.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if mf.GetName() == "cart_decider_lock_hold_seconds" && l.GetName() == "op" && l.GetValue() == "snapshot_restore" {
					return int(testkit.SampleValue(m))
				}
			}
		}
	}
	return 0
}
