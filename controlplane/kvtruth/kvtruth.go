package kvtruth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/index"
	"github.com/cartrouter/cart/kvevents"
	"github.com/cartrouter/cart/kvevents/zmtpguard"
)

// Applier is the engine side. Its calls may come from several goroutines.
type Applier interface {
	// ClearHoldings drops every holding of worker.
	ClearHoldings(worker string)
	// ApplyKVReport makes worker's model follow its engine's report and
	// removes the holdings the report says are gone.
	ApplyKVReport(worker string, r engine.KVReport)
}

// Source is one worker's event stream(s).
type Source struct {
	Worker string
	// Endpoint is the engine's PUB (rank 0) that CART dials; "" when the
	// engine dials the shared Listen endpoint instead.
	Endpoint string
	// ReplayEndpoint is the engine's replay ROUTER for rank 0 ("" = none).
	ReplayEndpoint string
	// Topic: what the engine puts in the first frame. With Listen it names
	// the engine; when dialling, "" accepts any topic.
	Topic string
	// DataParallelSize: ranks 1..n-1 publish on Endpoint's port + rank.
	DataParallelSize int
}

// Options configure Run.
type Options struct {
	Sources []Source
	// Listen is the SUB endpoint engines dial (llm-d's layout); "" = none.
	Listen string
	// BlockChars is the index block size: engine tokens are converted to
	// index blocks at CharsPerToken characters a token.
	BlockChars    int
	ReplayTimeout time.Duration
	// MaxHashesPerRank bounds the block hashes kept per engine rank (0:
	// DefaultMaxHashesPerRank); beyond it the oldest go.
	MaxHashesPerRank int
	// Guard bounds what the event sockets' peers may send and who may
	// connect to the listen socket (see kvevents/zmtpguard).
	Guard   zmtpguard.Limits
	Applier Applier
	Metrics *Metrics
	Logger  *slog.Logger
	Now     func() time.Time
}

// CharsPerToken is how many key characters the index counts per engine
// token, as cache_capacity_tokens does: the index's own assumption.
const CharsPerToken = index.CharsPerToken

// Runner is a running consumer: one subscriber per dialled endpoint (and
// rank), plus one for the listen endpoint.
type Runner struct {
	subs []*kvevents.Subscriber
	// ListenAddr is the bound listen address ("" without one).
	ListenAddr string
}

// Run is Start, then Close once ctx ends.
func Run(ctx context.Context, o Options) error {
	r, err := Start(o)
	if err != nil {
		return err
	}
	<-ctx.Done()
	r.Close()
	return nil
}

// Close closes every socket; no Applier call happens after it returns.
func (r *Runner) Close() {
	// In parallel: each Close waits out a grace for late connections
	// (kvevents), which must not add up over many engines at step-down.
	var wg sync.WaitGroup
	for _, s := range r.subs {
		wg.Go(func() { _ = s.Close() })
	}
	wg.Wait()
}

// Start subscribes to every source. A bind failure is returned; engines
// that are not up yet are dialled again in the background.
func Start(o Options) (_ *Runner, err error) {
	t, err := newTracker(o)
	if err != nil {
		return nil, err
	}
	if err := Validate(o.Sources, o.Listen); err != nil {
		return nil, err
	}
	r := &Runner{}
	defer func() {
		if err != nil {
			r.Close()
		}
	}()
	guard := o.Guard
	guard.Logger = t.log
	onReject := guard.OnReject
	guard.OnReject = func(reason string) {
		t.o.Metrics.refused.WithLabelValues(reason).Inc()
		if onReject != nil {
			onReject(reason)
		}
	}
	listenTopics := map[string]kvevents.Route{}
	for _, src := range o.Sources {
		if src.Endpoint == "" {
			// One socket for every engine and rank: the batch says its rank.
			listenTopics[src.Topic] = kvevents.Route{Worker: src.Worker, ReplayEndpoint: src.ReplayEndpoint, PayloadRank: true, MaxRanks: src.DataParallelSize}
			continue
		}
		for rank := range max(src.DataParallelSize, 1) {
			// One socket per rank, at rank 0's ports + rank: SGLang's
			// batches do not name their rank, so the socket does.
			ep, err := kvevents.OffsetPort(src.Endpoint, rank)
			if err != nil {
				return nil, err
			}
			route := kvevents.Route{Worker: src.Worker, Rank: rank}
			if src.ReplayEndpoint != "" {
				if route.ReplayEndpoint, err = kvevents.OffsetPort(src.ReplayEndpoint, rank); err != nil {
					return nil, err
				}
			}
			s, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{
				Endpoint: ep, Topics: map[string]kvevents.Route{src.Topic: route},
				Sink: t.sink, ReplayTimeout: o.ReplayTimeout, Logger: t.log, Guard: guard,
			})
			if err != nil {
				return nil, err
			}
			r.subs = append(r.subs, s)
		}
	}
	if len(listenTopics) > 0 {
		s, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{
			Endpoint: o.Listen, Listen: true, Topics: listenTopics,
			Sink: t.sink, ReplayTimeout: o.ReplayTimeout, Logger: t.log, Guard: guard,
		})
		if err != nil {
			return nil, err
		}
		r.subs = append(r.subs, s)
		r.ListenAddr = s.Addr().String()
	}
	t.log.Info("kv events: subscribed", "sources", len(o.Sources), "sockets", len(r.subs), "listen", r.ListenAddr)
	return r, nil
}

// tracker holds every worker's view of its engine's cache.
type tracker struct {
	o   Options
	log *slog.Logger
	mu  sync.Mutex
	ws  map[string]*workerView
}

type workerView struct {
	name  string
	mu    sync.Mutex // streams of one worker may be read by several sockets
	ranks map[int]*rankView
	// storedChars counts what the engine newly stored (in index
	// characters) and no report has passed on yet.
	storedChars int64
}

// rankView is one data-parallel rank's cache as its events describe it.
type rankView struct {
	blocks    *blockSet // engine block hashes held (GPU)
	blockSize int       // tokens per engine block
	peak      int64     // most tokens held since the engine started
	evicted   bool      // the engine has evicted: it is full at peak
	known     bool      // blocks is the engine's whole cache
}

func newTracker(o Options) (*tracker, error) {
	if o.Applier == nil || o.BlockChars <= 0 {
		return nil, errors.New("kv events: an applier and a block size are required")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	if o.MaxHashesPerRank <= 0 {
		o.MaxHashesPerRank = DefaultMaxHashesPerRank
	}
	return &tracker{o: o, log: o.Logger, ws: map[string]*workerView{}}, nil
}

func (t *tracker) worker(name string) *workerView {
	t.mu.Lock()
	defer t.mu.Unlock()
	w := t.ws[name]
	if w == nil {
		w = &workerView{name: name, ranks: map[int]*rankView{}}
		t.ws[name] = w
	}
	return w
}

// sink is the subscribers' StreamSink factory.
func (t *tracker) sink(worker string, rank int) kvevents.StreamSink {
	w := t.worker(worker)
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.ranks[rank]
	if r == nil {
		r = &rankView{blocks: newBlockSet(t.o.MaxHashesPerRank), known: true}
		w.ranks[rank] = r
	}
	return &stream{t: t, w: w, r: r}
}

type stream struct {
	t      *tracker
	w      *workerView
	r      *rankView
	warned bool // the cap's log line was written
}

// Batch applies a batch: a clear at once (it must not wait for the rest),
// then one report of the resulting occupancy.
func (s *stream) Batch(b kvevents.Batch, _ bool) {
	m := s.t.o.Metrics
	name := s.w.name
	removed := false
	dropped := 0
	// Counted per kind and added once per batch: a label lookup per event
	// would cost more than applying the event.
	var kinds [kvevents.AllBlocksCleared + 1]int
	s.w.mu.Lock()
	for _, ev := range b.Events {
		k := ev.Kind
		if int(k) >= len(kinds) {
			k = kvevents.Unknown
		}
		kinds[k]++
		if !onGPU(ev.Medium) {
			continue // offloaded tiers are not the prefix cache CART models
		}
		switch ev.Kind {
		case kvevents.BlockStored:
			if ev.BlockSize > 0 {
				s.r.blockSize = ev.BlockSize
			}
			for _, h := range ev.BlockHashes {
				added, d := s.r.blocks.add(h)
				dropped += d
				if added {
					s.w.storedChars += int64(max(s.r.blockSize, 1)) * CharsPerToken
				}
			}
		case kvevents.BlockRemoved:
			for _, h := range ev.BlockHashes {
				removed = s.r.blocks.remove(h) || removed
			}
		case kvevents.AllBlocksCleared:
			// Empty now, whatever was missed before: known again.
			s.r.blocks.clear()
			s.r.known = true
			m.clears.WithLabelValues(name).Inc()
			s.t.o.Applier.ClearHoldings(name)
		}
	}
	if removed && s.r.known {
		s.r.evicted = true
	}
	s.r.peak = max(s.r.peak, s.r.tokens())
	rep := s.w.report(s.t.o.BlockChars)
	rep.Evicted = removed
	s.w.mu.Unlock()
	for k, n := range kinds {
		if n > 0 {
			m.events.WithLabelValues(name, kvevents.Kind(k).String()).Add(float64(n))
		}
	}
	if dropped > 0 {
		m.dropped.WithLabelValues(name).Add(float64(dropped))
		if !s.warned {
			s.warned = true
			s.t.log.Warn("kv events: a rank reported more blocks than kv_events.max_hashes_per_rank; the oldest are dropped from its view (raise the cap if the engine is that large, else someone floods the event port)",
				"worker", name, "max_hashes_per_rank", s.t.o.MaxHashesPerRank)
		}
	}
	if b.TS > 0 {
		lag := s.t.o.Now().Sub(time.Unix(0, int64(b.TS*1e9))).Seconds()
		m.lag.WithLabelValues(name).Set(max(lag, 0))
	}
	s.t.apply(name, rep)
}

func (s *stream) Restarted() {
	s.t.o.Metrics.restarts.WithLabelValues(s.w.name).Inc()
	s.w.mu.Lock()
	// A new engine process: empty, and possibly of another size.
	*s.r = rankView{blocks: s.r.blocks, blockSize: s.r.blockSize, known: true}
	s.r.blocks.clear()
	rep := s.w.report(s.t.o.BlockChars)
	s.w.mu.Unlock()
	s.t.o.Applier.ClearHoldings(s.w.name)
	s.t.apply(s.w.name, rep)
}

func (s *stream) Replayed(from, to int64) {
	s.t.o.Metrics.gaps.WithLabelValues(s.w.name, "replayed").Inc()
	s.t.o.Metrics.replayed.WithLabelValues(s.w.name).Add(float64(to - from))
}

func (s *stream) Lost(from, to int64) {
	s.t.o.Metrics.gaps.WithLabelValues(s.w.name, "lost").Inc()
	s.w.mu.Lock()
	s.r.known = false
	rep := s.w.report(s.t.o.BlockChars)
	s.w.mu.Unlock()
	s.t.apply(s.w.name, rep)
}

func (t *tracker) apply(name string, rep engine.KVReport) {
	m := t.o.Metrics
	if rep.Synced {
		m.synced.WithLabelValues(name).Set(1)
		m.occupied.WithLabelValues(name).Set(float64(rep.OccupiedTokens))
		m.capacity.WithLabelValues(name).Set(float64(rep.CapacityTokens))
	} else {
		m.synced.WithLabelValues(name).Set(0)
	}
	t.o.Applier.ApplyKVReport(name, rep)
}

func onGPU(medium string) bool { return medium == "" || medium == kvevents.MediumGPU }

func (r *rankView) tokens() int64 { return int64(r.blocks.len()) * int64(max(r.blockSize, 1)) }

// report sums the ranks: synced only when every rank is known; a capacity
// only once every rank has evicted (a rank that never did may hold more).
// w.mu must be held.
func (w *workerView) report(blockChars int) engine.KVReport {
	rep := engine.KVReport{Synced: true}
	allEvicted := len(w.ranks) > 0
	var capacity int64
	for _, r := range w.ranks {
		if !r.known {
			w.storedChars = 0 // stores during the gap are not the ledger's to count
			return engine.KVReport{}
		}
		rep.OccupiedTokens += r.tokens()
		capacity += r.peak
		allEvicted = allEvicted && r.evicted
	}
	if allEvicted {
		rep.CapacityTokens = capacity
	}
	rep.StoredBlocks = int(w.storedChars / int64(blockChars))
	w.storedChars -= int64(rep.StoredBlocks) * int64(blockChars)
	rep.OccupiedBlocks = blocksOf(rep.OccupiedTokens, blockChars)
	rep.CapacityBlocks = blocksOf(rep.CapacityTokens, blockChars)
	if rep.CapacityTokens > 0 {
		rep.CapacityBlocks = max(rep.CapacityBlocks, 1)
	}
	return rep
}

func blocksOf(tokens int64, blockChars int) int {
	return int(tokens * CharsPerToken / int64(blockChars))
}

// Metrics are the event consumer's collectors, registered once per
// process (leadership comes and goes; the series stay).
type Metrics struct {
	events   *prometheus.CounterVec
	gaps     *prometheus.CounterVec
	replayed *prometheus.CounterVec
	restarts *prometheus.CounterVec
	clears   *prometheus.CounterVec
	lag      *prometheus.GaugeVec
	occupied *prometheus.GaugeVec
	capacity *prometheus.GaugeVec
	synced   *prometheus.GaugeVec
	dropped  *prometheus.CounterVec
	refused  *prometheus.CounterVec
}

// NewMetrics creates the collectors and registers them with reg (nil: not
// registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_kv_events_total",
			Help: "KV-cache events received from each worker's engine, by kind (rate() gives events/s)."}, []string{"worker", "kind"}),
		gaps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_kv_event_gaps_total",
			Help: "Sequence gaps in a worker's KV event stream: replayed (recovered from the engine's replay socket) or lost (beyond replay: the worker falls back to the approximate index)."}, []string{"worker", "outcome"}),
		replayed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_kv_event_replayed_batches_total",
			Help: "KV event batches recovered from a worker's replay socket."}, []string{"worker"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_kv_event_publisher_restarts_total",
			Help: "Times a worker's event publisher started again (its engine restarted: holdings dropped)."}, []string{"worker"}),
		clears: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_kv_event_clears_total",
			Help: "AllBlocksCleared events received: every holding of the worker dropped."}, []string{"worker"}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "cart_kv_event_lag_seconds",
			Help: "Age of a worker's last KV event batch when applied (engine publish time to now; includes clock skew between hosts)."}, []string{"worker"}),
		occupied: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "cart_kv_engine_occupied_tokens",
			Help: "Tokens in a worker's GPU prefix cache as its KV events report them (last synced value)."}, []string{"worker"}),
		capacity: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "cart_kv_engine_capacity_tokens",
			Help: "A worker's prefix-cache size as its events show it (peak occupancy once it has evicted; 0 before)."}, []string{"worker"}),
		synced: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "cart_kv_event_synced",
			Help: "1 while a worker's KV events are complete and drive its index model, 0 when it fell back to the approximate index."}, []string{"worker"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_kv_event_hashes_dropped_total",
			Help: "Block hashes dropped, oldest first, because a rank of a worker's engine reported more than kv_events.max_hashes_per_rank (a cap too low for the engine, or a flood on the event port)."}, []string{"worker"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_kv_event_connections_refused_total",
			Help: "Connections of the KV event sockets closed by CART, by reason: not_allowed (source outside kv_events.allowed_publishers), too_many_connections, handshake (none within the deadline), bad_greeting, bad_frame, oversize (a frame or message beyond kv_events.max_message_bytes)."}, []string{"reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.events, m.gaps, m.replayed, m.restarts, m.clears, m.lag, m.occupied, m.capacity, m.synced, m.dropped, m.refused)
	}
	return m
}

// Validate checks sources before anything is opened (config validation
// calls it too, so a bad endpoint fails --config-check).
func Validate(sources []Source, listen string) error {
	topics := map[string]string{}
	for _, s := range sources {
		if s.Worker == "" {
			return errors.New("kv events source without a worker")
		}
		if s.Endpoint == "" {
			if listen == "" {
				return fmt.Errorf("worker %s: kv_events without an endpoint needs kv_events.listen (engines dial it)", s.Worker)
			}
			if prev, dup := topics[s.Topic]; dup {
				return fmt.Errorf("workers %s and %s: the same kv_events topic %q on the listen endpoint", prev, s.Worker, s.Topic)
			}
			topics[s.Topic] = s.Worker
		}
		if s.DataParallelSize < 0 {
			return fmt.Errorf("worker %s: kv_events data_parallel_size %d is negative", s.Worker, s.DataParallelSize)
		}
		for _, ep := range []string{s.Endpoint, s.ReplayEndpoint} {
			if ep == "" {
				continue
			}
			if err := kvevents.CheckEndpoint(ep); err != nil {
				return fmt.Errorf("worker %s: %w", s.Worker, err)
			}
			if _, err := kvevents.OffsetPort(ep, max(s.DataParallelSize, 1)-1); err != nil {
				return fmt.Errorf("worker %s: %w", s.Worker, err)
			}
		}
	}
	return nil
}
