package kvevents

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/cartrouter/cart/kvevents/zmtpguard"
)

// StreamSink receives one publisher's batches (one engine, one
// data-parallel rank) in sequence order, and what the sequence numbers say
// about the batches it did not get. Its methods are called from one
// goroutine, in order.
type StreamSink interface {
	// Batch is the next batch. synced reports whether every batch since the
	// publisher started reached the sink (directly or by replay): only then
	// does the sink know the engine's whole cache.
	Batch(b Batch, synced bool)
	// Restarted reports that the publisher started again (its sequence went
	// back): the engine restarted, so its cache is empty.
	Restarted()
	// Replayed reports that batches [from, to) missed on the socket were
	// recovered from the replay socket (and handed to Batch already).
	Replayed(from, to int64)
	// Lost reports that batches [from, to) are gone beyond replay: what the
	// engine's cache holds is unknown until the next clear or restart.
	Lost(from, to int64)
}

// Route binds the messages of one topic to the worker that publishes them.
type Route struct {
	Worker string
	// ReplayEndpoint is the engine's replay ROUTER ("" = no replay: every
	// gap is a loss). With PayloadRank it is rank 0's, and rank r's is the
	// same address with its port increased by r, as vLLM and SGLang offset
	// it; otherwise it is Rank's own.
	ReplayEndpoint string
	// Rank is the data-parallel rank of every batch on this route, unless
	// PayloadRank: then each batch's data_parallel_rank says (absent: 0),
	// for one socket that carries several ranks (the listen layout).
	Rank        int
	PayloadRank bool
	// MaxRanks bounds the ranks a PayloadRank route accepts (0:
	// DefaultMaxRanks): each rank is a stream with its own block set, so a
	// publisher naming ranks at will must not create them at will.
	MaxRanks int
}

// DefaultMaxRanks is the most data-parallel ranks one listen-mode topic may
// carry when its worker's data_parallel_size is not set.
const DefaultMaxRanks = 64

// SubscriberConfig configures one SUB socket.
type SubscriberConfig struct {
	// Endpoint is dialled (an engine's bound PUB, e.g. tcp://10.0.0.5:5557)
	// or, with Listen, bound (engines dial it, llm-d's layout).
	Endpoint string
	Listen   bool
	// Topics maps each topic to its publisher. A topic is subscribed as a
	// prefix, as ZMQ does; a message is routed by its exact topic, or to
	// the "" entry when there is no exact one.
	Topics map[string]Route
	// Sink returns the sink of a (worker, data-parallel rank) stream, once
	// per stream, on the subscriber's goroutine.
	Sink func(worker string, rank int) StreamSink
	// ReplayTimeout bounds one replay exchange (default 2s).
	ReplayTimeout time.Duration
	// Logger receives gaps, restarts and socket errors (nil: discarded).
	Logger *slog.Logger
	// Replay fetches batches [from, to) from a replay endpoint; nil uses
	// the ROUTER protocol (ReplayFrom). Tests replace it.
	Replay func(ctx context.Context, endpoint string, from, to int64) ([]Message, error)
	// Guard bounds what peers may send and who may connect (zero: the
	// zmtpguard defaults, any source address); it applies to the replay
	// exchanges too.
	Guard zmtpguard.Limits
}

// Subscriber reads one SUB socket until Close.
type Subscriber struct {
	cfg     SubscriberConfig
	log     *slog.Logger
	sck     zmq4.Socket
	cancel  context.CancelFunc
	ctx     context.Context
	done    chan struct{}
	streams map[streamKey]*stream
	// lastRank is the rank a topic's last decodable batch carried: an
	// undecodable one is counted against it.
	lastRank map[string]int

	mu     sync.Mutex
	dialed bool
	err    error
}

type streamKey struct {
	topic string
	rank  int
}

// stream tracks one publisher's sequence.
type stream struct {
	route  Route
	rank   int
	sink   StreamSink
	next   int64 // the sequence number expected next
	synced bool  // every batch from 0 to next-1 was applied
}

// NewSubscriber opens the socket (a bind happens at once; a dial is
// retried in the background until the engine answers) and starts reading.
func NewSubscriber(cfg SubscriberConfig) (*Subscriber, error) {
	if cfg.Endpoint == "" {
		return nil, errors.New("kv events subscriber: an endpoint is required")
	}
	if len(cfg.Topics) == 0 || cfg.Sink == nil {
		return nil, errors.New("kv events subscriber: topics and a sink are required")
	}
	if cfg.ReplayTimeout <= 0 {
		cfg.ReplayTimeout = 2 * time.Second
	}
	if cfg.Replay == nil {
		cfg.Replay = ReplayFrom
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Guard.Logger == nil {
		cfg.Guard.Logger = logger
	}
	ctx, cancel := context.WithCancel(zmtpguard.Context(context.Background(), cfg.Guard))
	s := &Subscriber{cfg: cfg, log: logger, cancel: cancel, ctx: ctx, done: make(chan struct{}), streams: map[streamKey]*stream{}, lastRank: map[string]int{}}
	// Retried forever (until Close) and re-dialled when the engine goes
	// away: an engine restart must not end the subscription.
	s.sck = zmq4.NewSub(ctx, append(guarded(logger), zmq4.WithDialerMaxRetries(-1), zmq4.WithDialerRetry(500*time.Millisecond), zmq4.WithAutomaticReconnect(!cfg.Listen))...)
	for topic := range cfg.Topics {
		if err := s.sck.SetOption(zmq4.OptionSubscribe, topic); err != nil {
			cancel()
			_ = s.sck.Close()
			return nil, fmt.Errorf("kv events subscribe %q: %w", topic, err)
		}
	}
	if cfg.Listen {
		if err := s.sck.Listen(zmtpguard.Endpoint(cfg.Endpoint)); err != nil {
			cancel()
			_ = s.sck.Close()
			return nil, fmt.Errorf("kv events SUB listen %s: %w", cfg.Endpoint, err)
		}
		s.dialed = true
		go s.read()
		return s, nil
	}
	go func() {
		if err := s.sck.Dial(zmtpguard.Endpoint(cfg.Endpoint)); err != nil {
			if ctx.Err() == nil {
				s.log.Error("kv events: dialling the engine's publisher", "endpoint", cfg.Endpoint, "err", err)
			}
			s.mu.Lock()
			s.err = err
			s.mu.Unlock()
			close(s.done)
			return
		}
		s.mu.Lock()
		s.dialed = true
		s.mu.Unlock()
		s.read()
	}()
	return s, nil
}

// Addr is the bound address in Listen mode (nil otherwise).
func (s *Subscriber) Addr() net.Addr { return s.sck.Addr() }

// Connected reports whether the socket is bound or its dial succeeded.
func (s *Subscriber) Connected() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dialed
}

// Close stops reading and closes the socket; the sinks get no call after
// it returns.
func (s *Subscriber) Close() error {
	s.cancel()
	err := s.sck.Close()
	<-s.done
	closeLate(s.sck)
	return err
}

func (s *Subscriber) read() {
	defer close(s.done)
	for {
		m, err := s.sck.Recv()
		if err != nil {
			if s.ctx.Err() != nil {
				return
			}
			s.log.Warn("kv events: receiving", "endpoint", s.cfg.Endpoint, "err", err)
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		msg, err := ParseMessage(m.Frames)
		if err != nil {
			s.log.Warn("kv events: malformed message", "endpoint", s.cfg.Endpoint, "err", err)
			continue
		}
		s.handleSafely(msg)
	}
}

// handleSafely is handle, surviving a panic: the message comes from a
// peer, and no peer may end the process. The topic's streams count as lost
// (what the message would have changed is unknown).
func (s *Subscriber) handleSafely(msg Message) {
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("kv events: panic handling a message; its streams fall back to the approximate index",
				"endpoint", s.cfg.Endpoint, "topic", msg.Topic, "seq", msg.Seq, "panic", r, "stack", string(debug.Stack()))
			for k, st := range s.streams {
				if k.topic == msg.Topic {
					func() {
						defer func() { _ = recover() }()
						s.lost(st, st.next, st.next+1, "panic")
					}()
				}
			}
		}
	}()
	s.handle(msg)
}

// guarded are the zmq4 options of every socket that talks to engines: the
// checked handshake, and zmq4's own log lines (a refused handshake, a
// failed accept) at debug level, so a peer cannot flood the log.
func guarded(logger *slog.Logger) []zmq4.Option {
	zmtpguard.Register()
	return []zmq4.Option{
		zmq4.WithSecurity(zmtpguard.Security()),
		zmq4.WithLogger(slog.NewLogLogger(logger.Handler(), slog.LevelDebug)),
	}
}

// route finds a topic's publisher: its exact entry, else the "" entry.
func (s *Subscriber) route(topic string) (Route, bool) {
	if r, ok := s.cfg.Topics[topic]; ok {
		return r, true
	}
	r, ok := s.cfg.Topics[""]
	return r, ok
}

// handle applies one message in sequence, replaying what its sequence
// number says is missing.
func (s *Subscriber) handle(msg Message) {
	route, ok := s.route(msg.Topic)
	if !ok {
		return // a prefix subscription matched a topic nobody configured
	}
	b, err := Decode(msg.Payload)
	if err != nil {
		// Undecodable is as good as lost: its events cannot be applied.
		s.log.Warn("kv events: undecodable batch", "worker", route.Worker, "seq", msg.Seq, "err", err)
	}
	rank := route.Rank
	if route.PayloadRank {
		rank = s.lastRank[msg.Topic]
		if err == nil {
			rank = 0
			if b.DPRank != nil {
				rank = *b.DPRank
			}
			if maxRanks := cmp.Or(route.MaxRanks, DefaultMaxRanks); rank < 0 || rank >= maxRanks {
				s.log.Warn("kv events: batch of a data-parallel rank out of range, dropped", "worker", route.Worker, "rank", rank, "ranks", maxRanks)
				return
			}
			s.lastRank[msg.Topic] = rank
		}
	}
	if msg.Seq < 0 || msg.Seq == math.MaxInt64 {
		// -1 ends a replay; the last number has no next.
		s.log.Warn("kv events: sequence number out of range", "worker", route.Worker, "seq", msg.Seq)
		return
	}
	key := streamKey{msg.Topic, rank}
	st := s.streams[key]
	switch {
	case st == nil:
		// Known from the first batch seen, whatever its number: vLLM's
		// publisher starts at 0, llm-d-inference-sim's at 1, and a
		// publisher joined late holds blocks stored before CART came,
		// which no event will name. Those are its oldest blocks, so an
		// LRU engine evicts them before any it reports; and replay could
		// not bring them back (it starts at a number the publisher may
		// never have used, or past the buffer).
		st = &stream{route: route, rank: rank, sink: s.cfg.Sink(route.Worker, rank), synced: true, next: msg.Seq}
		s.streams[key] = st
	case msg.Seq < st.next:
		// The sequence went back: a new publisher, so a new engine
		// process with an empty cache, known from this batch on (its
		// first number is its own business, as above).
		s.log.Info("kv events: publisher restarted, engine cache treated as empty", "worker", route.Worker, "rank", rank, "seq", msg.Seq, "expected", st.next)
		st.sink.Restarted()
		st.next, st.synced = msg.Seq, true
	case msg.Seq > st.next:
		s.catchUp(st, msg.Seq)
	}
	st.next = msg.Seq + 1
	if err != nil {
		s.lost(st, msg.Seq, msg.Seq+1, "undecodable")
		return
	}
	st.sink.Batch(b, st.synced)
}

// catchUp replays [st.next, upto) or declares it lost.
func (s *Subscriber) catchUp(st *stream, upto int64) {
	from := st.next
	if st.route.ReplayEndpoint == "" {
		s.lost(st, from, upto, "no replay endpoint")
		return
	}
	endpoint := st.route.ReplayEndpoint
	if st.route.PayloadRank {
		var err error
		if endpoint, err = OffsetPort(endpoint, st.rank); err != nil {
			s.lost(st, from, upto, err.Error())
			return
		}
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.ReplayTimeout)
	msgs, err := s.cfg.Replay(ctx, endpoint, from, upto)
	cancel()
	if err != nil {
		s.lost(st, from, upto, "replay failed: "+err.Error())
		return
	}
	// The replay must start exactly where the stream stopped and run
	// without a hole; anything else means the buffer no longer holds it.
	var batches []Batch
	want := from
	for _, m := range msgs {
		if m.Seq < want || m.Seq >= upto {
			continue
		}
		if m.Seq != want {
			break
		}
		b, err := Decode(m.Payload)
		if err != nil {
			break
		}
		batches = append(batches, b)
		want++
	}
	for _, b := range batches {
		st.sink.Batch(b, st.synced)
	}
	if want < upto {
		s.lost(st, want, upto, "beyond the replay buffer")
		return
	}
	st.sink.Replayed(from, upto)
	s.log.Debug("kv events: gap replayed", "worker", st.route.Worker, "rank", st.rank, "from", from, "to", upto)
}

func (s *Subscriber) lost(st *stream, from, to int64, why string) {
	s.log.Warn("kv events: batches lost, worker falls back to the approximate index until its engine's next cache clear or restart",
		"worker", st.route.Worker, "rank", st.rank, "from", from, "to", to, "cause", why)
	st.synced = false
	st.sink.Lost(from, to)
}

// ReplayFrom asks a replay ROUTER for the batches from `from` on and
// returns those below `to` (it stops reading once it has them, or at the
// end-of-replay marker). The exchange is bounded by ctx.
func ReplayFrom(ctx context.Context, endpoint string, from, to int64) ([]Message, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	d := zmq4.NewDealer(ctx, append(guarded(slog.New(slog.DiscardHandler)), zmq4.WithDialerMaxRetries(0))...)
	defer d.Close()
	if err := d.Dial(zmtpguard.Endpoint(endpoint)); err != nil {
		return nil, err
	}
	// The empty delimiter makes the request look like a REQ socket's,
	// which vLLM's replay loop insists on ([identity, "", start]).
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, SeqBytes(from))); err != nil {
		return nil, err
	}
	var out []Message
	for {
		m, err := d.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return out, fmt.Errorf("replay from %s: %w", endpoint, ctx.Err())
			}
			return out, err
		}
		ans, err := ParseReplayAnswer(m.Frames)
		if err != nil {
			return out, err
		}
		if ans.Seq == EndOfReplay {
			return out, nil
		}
		if len(out) == 0 && ans.Seq > from {
			// The buffer starts past the gap: it cannot be filled, so the
			// rest (up to a whole buffer of batches) is not worth reading.
			return []Message{ans}, nil
		}
		out = append(out, ans)
		seq := ans.Seq
		if seq >= to-1 {
			return out, nil
		}
	}
}

// OffsetPort returns endpoint with its TCP port increased by n, as vLLM
// derives data-parallel rank n's endpoints from rank 0's.
func OffsetPort(endpoint string, n int) (string, error) {
	if n == 0 {
		return endpoint, nil
	}
	i := strings.LastIndexByte(endpoint, ':')
	if !strings.HasPrefix(endpoint, "tcp://") || i < len("tcp://") {
		return "", fmt.Errorf("cannot offset %q by rank %d: not tcp://host:port", endpoint, n)
	}
	port, err := strconv.Atoi(endpoint[i+1:])
	if err != nil || port+n > 65535 || port+n <= 0 {
		return "", fmt.Errorf("cannot offset %q by rank %d: bad port", endpoint, n)
	}
	return endpoint[:i+1] + strconv.Itoa(port+n), nil
}

// CheckEndpoint accepts the ZMQ endpoints CART can use: tcp://host:port
// (host may be * or 0.0.0.0 to bind every interface) and ipc://path.
func CheckEndpoint(ep string) error {
	switch {
	case strings.HasPrefix(ep, "ipc://") && len(ep) > len("ipc://"):
		return nil
	case strings.HasPrefix(ep, "tcp://"):
		host, port, err := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
		if err != nil || host == "" {
			return fmt.Errorf("kv events endpoint %q: want tcp://host:port", ep)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			return fmt.Errorf("kv events endpoint %q: bad port", ep)
		}
		return nil
	}
	return fmt.Errorf("kv events endpoint %q: want tcp://host:port or ipc://path", ep)
}
