package discovery

import (
	"cmp"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// scripted answers from a list that the test swaps.
type scripted struct {
	mu  sync.Mutex
	ans Answer
	n   int
}

func (s *scripted) set(a Answer) { s.mu.Lock(); s.ans = a; s.mu.Unlock() }
func (s *scripted) Resolve(context.Context) Answer {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	return s.ans
}
func (s *scripted) count() int { s.mu.Lock(); defer s.mu.Unlock(); return s.n }

type fakeSink struct {
	mu       sync.Mutex
	pool     map[string]string
	draining map[string]bool
	load     map[string]int
	failAdds int
	source   string // of added workers; "" = dns
	drains   int    // SetDraining(_, true) calls
	removes  int
	roles    map[string]string // role each worker was added with, when not both
}

func (f *fakeSink) Pool() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]string{}
	for k, v := range f.pool {
		out[k] = v
	}
	return out
}
func (f *fakeSink) Add(_ context.Context, u, role string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failAdds > 0 {
		f.failAdds--
		return errors.New("not the leader")
	}
	f.pool[u] = cmp.Or(f.source, "dns")
	if role != "" {
		if f.roles == nil {
			f.roles = map[string]string{}
		}
		f.roles[u] = role
	}
	return nil
}

func (f *fakeSink) roleOf(u string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.roles[u]
}
func (f *fakeSink) Remove(_ context.Context, u string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.pool, u)
	f.removes++
	return nil
}
func (f *fakeSink) SetDraining(u string, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.draining[u] = on
	if on {
		f.drains++
	}
}
func (f *fakeSink) setLoad(u string, n int) { f.mu.Lock(); f.load[u] = n; f.mu.Unlock() }
func (f *fakeSink) counts() (drains, removes int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.drains, f.removes
}
func (f *fakeSink) Load(u string) int { f.mu.Lock(); defer f.mu.Unlock(); return f.load[u] }
func (f *fakeSink) get(u string) (string, bool, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	src, ok := f.pool[u]
	return src, ok, f.draining[u]
}

// The watcher retries a failed add, never drains or removes a worker of
// another source with the same URL, starts from the pool's own workers,
// and undrains what it drained when it stops (a leader stepping down).
func TestWatcher(t *testing.T) {
	res := &scripted{}
	res.set(Answer{Endpoints: []string{"http://old:1", "http://new:1", "http://static:1"}})
	sink := &fakeSink{
		pool:     map[string]string{"http://old:1": "dns", "http://static:1": "static", "http://gone:1": "dns"},
		draining: map[string]bool{},
		load:     map[string]int{"http://gone:1": 1},
		failAdds: 1,
	}
	m := NewMetrics(prometheus.NewRegistry())
	w := NewWatcher(WatchOptions{Source: "dns", Resolver: res, Sink: sink, Metrics: m, SettleEvery: time.Millisecond,
		Rules: Options{AddAfter: 1, RemoveAfter: 2, DrainTimeout: time.Hour, MinInterval: time.Millisecond, MaxInterval: time.Millisecond}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	defer func() { cancel(); <-done }()

	testkit.WaitFor(t, 10*time.Second, "new added after a failed first try", func() bool { src, ok, _ := sink.get("http://new:1"); return ok && src == "dns" })
	testkit.WaitFor(t, 10*time.Second, "gone draining", func() bool { _, _, d := sink.get("http://gone:1"); return d })
	if _, ok, _ := sink.get("http://gone:1"); !ok {
		t.Fatal("gone removed while a request is in flight")
	}
	// static leaves DNS: it is not discovery's to drain.
	res.set(Answer{Endpoints: []string{"http://old:1", "http://new:1"}})
	n := res.count()
	testkit.WaitFor(t, 10*time.Second, "several answers without static", func() bool { return res.count() > n+5 })
	if src, ok, d := sink.get("http://static:1"); !ok || src != "static" || d {
		t.Fatalf("static worker touched: present=%v source=%q draining=%v", ok, src, d)
	}
	// An error keeps everything and says so.
	res.set(Answer{Err: errors.New("timeout")})
	testkit.WaitFor(t, 10*time.Second, "stale", func() bool { return gauge(m.Stale.WithLabelValues("dns")) == 1 })
	if _, ok, _ := sink.get("http://new:1"); !ok {
		t.Fatal("an error removed a worker")
	}
	cancel()
	<-done
	if _, _, d := sink.get("http://gone:1"); d {
		t.Fatal("a stopped watcher left a worker draining")
	}
}

func gauge(g prometheus.Gauge) float64 {
	var m dto.Metric
	_ = g.Write(&m)
	return m.GetGauge().GetValue()
}
