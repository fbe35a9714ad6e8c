package kvtruth

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/kvevents"
	"github.com/cartrouter/cart/sim"
	"github.com/cartrouter/cart/sim/simtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testkit.IgnoreZMQPubWriter)
}

// fakeApplier records what the tracker asks of the engine.
type fakeApplier struct {
	mu      sync.Mutex
	clears  []string
	reports []engine.KVReport
}

func (f *fakeApplier) ClearHoldings(w string) {
	f.mu.Lock()
	f.clears = append(f.clears, w)
	f.mu.Unlock()
}

func (f *fakeApplier) ApplyKVReport(_ string, r engine.KVReport) {
	f.mu.Lock()
	f.reports = append(f.reports, r)
	f.mu.Unlock()
}

func (f *fakeApplier) last() engine.KVReport {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reports[len(f.reports)-1]
}

func storedBatch(blockSize int, hashes ...uint64) kvevents.Batch {
	return kvevents.Batch{TS: 1, Events: []kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: hashes, BlockSize: blockSize, Medium: kvevents.MediumGPU}}}
}

func removedBatch(hashes ...uint64) kvevents.Batch {
	return kvevents.Batch{TS: 1, Events: []kvevents.Event{{Kind: kvevents.BlockRemoved, BlockHashes: hashes}}}
}

func newTestTracker(t *testing.T, f *fakeApplier) (*tracker, *Metrics) {
	t.Helper()
	m := NewMetrics(prometheus.NewRegistry())
	tr, err := newTracker(Options{Applier: f, BlockChars: 64, Metrics: m, Now: func() time.Time { return time.Unix(3, 0) }})
	if err != nil {
		t.Fatal(err)
	}
	return tr, m
}

// Stored and removed blocks give the occupancy; the capacity is the peak
// once the engine has evicted; removals ask for a trim.
func TestOccupancyFromStoredAndRemovedBlocks(t *testing.T) {
	f := &fakeApplier{}
	tr, m := newTestTracker(t, f)
	s := tr.sink("w", 0)
	s.Batch(storedBatch(16, 1, 2, 3, 4), true)
	s.Batch(storedBatch(16, 4, 5), true) // 4 again: counted once
	if r := f.last(); !r.Synced || r.OccupiedTokens != 80 || r.CapacityTokens != 0 || r.Evicted || r.OccupiedBlocks != 5 {
		t.Fatalf("after stores: %+v", r)
	}
	s.Batch(removedBatch(1, 2, 99), true) // 99 was never stored
	r := f.last()
	if !r.Evicted || r.OccupiedTokens != 48 || r.CapacityTokens != 80 || r.OccupiedBlocks != 3 || r.CapacityBlocks != 5 {
		t.Fatalf("after eviction: %+v", r)
	}
	// Offloaded tiers are not the GPU prefix cache.
	cpu := storedBatch(16, 7)
	cpu.Events[0].Medium = "CPU"
	s.Batch(cpu, true)
	if f.last().OccupiedTokens != 48 {
		t.Fatalf("a CPU block counted: %+v", f.last())
	}
	wantMetric(t, "occupancy metric", m.occupied.WithLabelValues("w"), 48)
	wantMetric(t, "stored events", m.events.WithLabelValues("w", "BlockStored"), 3)
	wantMetric(t, "lag in seconds (batch at 1 s, applied at 3 s)", m.lag.WithLabelValues("w"), 2)
}

// A loss degrades the worker until its engine's state is known again: a
// clear (empty now) or a restart.
func TestLossDegradesUntilClearOrRestart(t *testing.T) {
	f := &fakeApplier{}
	tr, m := newTestTracker(t, f)
	s := tr.sink("w", 0)
	s.Batch(storedBatch(16, 1, 2), true)
	s.Lost(1, 4)
	if f.last().Synced {
		t.Fatal("still synced after a loss")
	}
	s.Batch(storedBatch(16, 3), false)
	if f.last().Synced {
		t.Fatal("synced again without a known state")
	}
	s.Batch(kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.AllBlocksCleared}}}, false)
	if r := f.last(); !r.Synced || r.OccupiedTokens != 0 {
		t.Fatalf("after a clear: %+v", r)
	}
	s.Lost(9, 10)
	s.Restarted()
	if r := f.last(); !r.Synced || r.OccupiedTokens != 0 || len(f.clears) != 2 {
		t.Fatalf("after a restart: %+v, clears %v", r, f.clears)
	}
	wantMetric(t, "lost gaps", m.gaps.WithLabelValues("w", "lost"), 2)
	wantMetric(t, "synced gauge", m.synced.WithLabelValues("w"), 1)
}

// Data-parallel ranks add up; the worker is synced only when every rank is
// known, and has a capacity only once every rank has evicted.
func TestRanksAddUp(t *testing.T) {
	f := &fakeApplier{}
	tr, _ := newTestTracker(t, f)
	r0, r1 := tr.sink("w", 0), tr.sink("w", 1)
	r0.Batch(storedBatch(16, 1, 2), true)
	r1.Batch(storedBatch(16, 3), true)
	if r := f.last(); r.OccupiedTokens != 48 {
		t.Fatalf("%+v", r)
	}
	r0.Batch(removedBatch(1), true)
	if r := f.last(); r.CapacityTokens != 0 {
		t.Fatalf("capacity before every rank evicted: %+v", r)
	}
	r1.Batch(removedBatch(3), true)
	if r := f.last(); r.CapacityTokens != 48 || r.OccupiedTokens != 16 {
		t.Fatalf("%+v", r)
	}
	r1.Lost(0, 1)
	if f.last().Synced {
		t.Fatal("synced with a lost rank")
	}
}

// runFor starts Run and stops it at the end of the test, checking it
// returned.
func runFor(t *testing.T, o Options) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, o) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after its context ended")
		}
	})
}

func newPublisher(t *testing.T, cfg kvevents.PublisherConfig) *kvevents.Publisher {
	t.Helper()
	if cfg.Endpoint == "" {
		cfg.Endpoint = "tcp://127.0.0.1:0"
	}
	p, err := kvevents.NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

const testBlockChars = 64

// local applies the events to a decider the way the all-in-one router
// does (dataplane/router.Local), without importing the data plane.
type local struct{ dec *decider.Decider }

func (l local) ClearHoldings(w string) {
	l.dec.Do(decider.OpKV, func(eng *engine.Engine) { eng.ClearHoldings(w) })
}

func (l local) ApplyKVReport(w string, r engine.KVReport) {
	l.dec.Do(decider.OpKV, func(eng *engine.Engine) { eng.RemoveHoldings(w, eng.ApplyKVReport(w, r, nil)) })
}

func (l local) kv(w string) engine.KVState { return l.dec.KVStates()[w] }

func newLocal(workers ...string) local {
	specs := make([]engine.WorkerSpec, len(workers))
	for i, w := range workers {
		specs[i] = engine.WorkerSpec{URL: w}
	}
	dec := decider.New(decider.Options{
		Policy:      engine.Policy{Threshold: 0.3, BalanceAbsThreshold: 100, BalanceRelThreshold: 100, BlockChars: testBlockChars},
		MaxEntries:  10_000,
		InlineEvict: true,
	})
	dec.SetWorkers(specs)
	return local{dec}
}

func route(t *testing.T, l local, text string, dry bool, exclude ...string) decider.Decision {
	t.Helper()
	d, err := l.dec.Decide(decider.Request{Request: engine.Request{
		Hashes: index.Hash(nil, "m", []byte(text), testBlockChars), KeyLen: len(text), DryRun: dry, Exclude: exclude,
	}})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func complete(t *testing.T, url, prompt string) {
	t.Helper()
	body := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":1}`, prompt)
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("completion: %d", resp.StatusCode)
	}
}

// The whole chain against cart-sim: a replica's cache reset (its
// AllBlocksCleared) stops the router treating it as a holder within 100 ms,
// and its stored blocks show as the worker's occupancy.
func TestAllBlocksClearedStopsHoldingWithin100ms(t *testing.T) {
	pub := newPublisher(t, kvevents.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:0"})
	replica := simtest.Start(t, sim.Config{BlockTokens: 16, KVEvents: pub})
	other := "http://127.0.0.1:1"
	l := newLocal(replica.URL, other)
	runFor(t, Options{
		Sources:    []Source{{Worker: replica.URL, Endpoint: "tcp://" + pub.Addr().String(), ReplayEndpoint: "tcp://" + pub.ReplayAddr().String()}},
		BlockChars: testBlockChars, Applier: l, Metrics: NewMetrics(nil),
	})
	testkit.WaitFor(t, 10*time.Second, "the subscription", func() bool { return pub.Subscribed("") })

	prompt := strings.Repeat("the same long system prompt, ", 40)
	if d := route(t, l, prompt, false, other); d.Worker != replica.URL {
		t.Fatalf("first route went to %s", d.Worker)
	}
	complete(t, replica.URL, prompt)
	if err := l.dec.Settle(route(t, l, prompt, false).Ticket, decider.Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitForMsg(t, 10*time.Second, "the replica's occupancy", func() (bool, string) {
		k := l.kv(replica.URL)
		return k.On && k.OccupiedTokens > 0, fmt.Sprintf("%+v", k)
	})
	if d := route(t, l, prompt, true); d.Worker != replica.URL || d.Reason != engine.ReasonCacheHit {
		t.Fatalf("before the reset: %+v", d)
	}

	resp, err := http.Post(replica.URL+"/sim/reset", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	start := time.Now()
	testkit.WaitForMsg(t, 100*time.Millisecond, "the replica no longer counted as a holder", func() (bool, string) {
		d := route(t, l, prompt, true)
		return d.Reason != engine.ReasonCacheHit, fmt.Sprintf("%+v", d)
	})
	t.Logf("holdings dropped %v after the reset answered", time.Since(start))
}

// A gap beyond the replay buffer puts the worker back on the approximate
// index (metric, log line), and the engine's next clear brings it back.
func TestGapBeyondReplayDegrades(t *testing.T) {
	pub := newPublisher(t, kvevents.PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:0", Buffer: 1})
	l := newLocal("http://w")
	m := NewMetrics(prometheus.NewRegistry())
	logs := testkit.NewLogRecorder()
	runFor(t, Options{
		Sources:    []Source{{Worker: "http://w", Endpoint: "tcp://" + pub.Addr().String(), ReplayEndpoint: "tcp://" + pub.ReplayAddr().String()}},
		BlockChars: testBlockChars, Applier: l, Metrics: m, Logger: slog.New(logs),
	})
	testkit.WaitFor(t, 10*time.Second, "the subscription", func() bool { return pub.Subscribed("") })
	kv := func() engine.KVState { return l.kv("http://w") }
	pub.Publish(storedBatch(16, 1).Events)
	testkit.WaitFor(t, 10*time.Second, "events applied", func() bool { return kv().On })
	pub.DropNext(3)
	for h := uint64(2); h <= 5; h++ {
		pub.Publish(storedBatch(16, h).Events)
	}
	testkit.WaitFor(t, 10*time.Second, "the worker degraded", func() bool {
		return value(m.gaps.WithLabelValues("http://w", "lost")) == 1 && !kv().On
	})
	if logs.Count(slog.LevelWarn, "batches lost") == 0 {
		t.Fatal("no log line for the loss")
	}
	pub.Publish([]kvevents.Event{{Kind: kvevents.AllBlocksCleared}})
	testkit.WaitFor(t, 10*time.Second, "synced again after the clear", func() bool { return kv().On })
}

func TestValidate(t *testing.T) {
	for _, c := range []struct {
		sources []Source
		listen  string
		ok      bool
	}{
		{[]Source{{Worker: "a", Endpoint: "tcp://10.0.0.1:5557", ReplayEndpoint: "tcp://10.0.0.1:5558", DataParallelSize: 2}}, "", true},
		{[]Source{{Worker: "a", Topic: "kv@a@m"}, {Worker: "b", Topic: "kv@b@m"}}, "tcp://*:5557", true},
		{[]Source{{Worker: "a", Topic: "kv@a@m"}}, "", false},
		{[]Source{{Worker: "a", Topic: "t"}, {Worker: "b", Topic: "t"}}, "tcp://*:5557", false},
		{[]Source{{Worker: "a", Endpoint: "http://x:1"}}, "", false},
		{[]Source{{Worker: "a", Endpoint: "tcp://x:65535", DataParallelSize: 2}}, "", false},
		{[]Source{{Worker: "a", Endpoint: "tcp://x:1", DataParallelSize: -1}}, "", false},
		{[]Source{{Endpoint: "tcp://x:1"}}, "", false},
	} {
		if err := Validate(c.sources, c.listen); (err == nil) != c.ok {
			t.Errorf("Validate(%+v, %q) = %v", c.sources, c.listen, err)
		}
	}
}

// wantMetric fails the test unless counter or gauge c reads want.
func wantMetric(t *testing.T, what string, c prometheus.Metric, want float64) {
	t.Helper()
	if got := value(c); got != want {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

// value reads one counter or gauge.
func value(c prometheus.Metric) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	if m.Gauge != nil {
		return m.GetGauge().GetValue()
	}
	return m.GetCounter().GetValue()
}
