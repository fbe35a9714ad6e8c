package kvevents

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/cartrouter/cart/kvevents/zmtpguard"
)

// DefaultReplayBuffer is how many batches a Publisher keeps for replay, as
// vLLM's default buffer_steps.
const DefaultReplayBuffer = 10_000

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Endpoint is the PUB socket's address, e.g. "tcp://127.0.0.1:5557".
	// The socket binds it, as an engine's "tcp://*:5557" does, unless
	// Connect is set.
	Endpoint string
	// Connect dials Endpoint instead, for the layout where the consumer
	// binds one SUB endpoint and every engine connects to it.
	Connect bool
	// ReplayEndpoint, when set, is bound by a ROUTER socket serving replay
	// requests.
	ReplayEndpoint string
	// Topic is the first frame of every message ("" is allowed).
	Topic    string
	Encoding Encoding
	// Buffer is how many batches are kept for replay; 0 means
	// DefaultReplayBuffer.
	Buffer int
	// DPRank is sent as every batch's data_parallel_rank.
	DPRank int
	// Logger receives replay and socket errors; nil discards them.
	Logger *slog.Logger
}

// Publisher sends event batches the way vLLM's ZmqEventPublisher does. Its
// methods are safe for concurrent use.
type Publisher struct {
	cfg    PublisherConfig
	log    *slog.Logger
	pub    zmq4.Socket
	replay zmq4.Socket // nil without a replay endpoint
	cancel context.CancelFunc
	done   chan struct{} // closed when the replay loop has returned

	mu   sync.Mutex
	next int64 // sequence number of the next batch
	// ring holds the last cfg.Buffer batches; once full, the oldest is at
	// index head and is overwritten next.
	ring   []stored
	head   int
	closed bool
	// unsent makes the next batches go to the replay buffer only, as if
	// the network had lost them (tests of gap handling).
	unsent int
}

type stored struct {
	seq     int64
	payload []byte
}

// NewPublisher opens the sockets. Close releases them.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if cfg.Endpoint == "" {
		return nil, errors.New("kv events: a PUB endpoint is required")
	}
	if cfg.Buffer == 0 {
		cfg.Buffer = DefaultReplayBuffer
	}
	if cfg.Buffer < 0 {
		return nil, fmt.Errorf("kv events: replay buffer %d must be positive", cfg.Buffer)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	// Bounded as the subscriber is: the consumer is a peer too.
	ctx, cancel := context.WithCancel(zmtpguard.Context(context.Background(), zmtpguard.Limits{Logger: logger}))
	p := &Publisher{cfg: cfg, log: logger, cancel: cancel, done: make(chan struct{})}
	p.pub = zmq4.NewPub(ctx, guarded(logger)...)
	var err error
	if cfg.Connect {
		err = p.pub.Dial(zmtpguard.Endpoint(cfg.Endpoint))
	} else {
		err = p.pub.Listen(zmtpguard.Endpoint(cfg.Endpoint))
	}
	if err != nil {
		cancel()
		_ = p.pub.Close()
		return nil, fmt.Errorf("kv events PUB %s: %w", cfg.Endpoint, err)
	}
	if cfg.ReplayEndpoint == "" {
		close(p.done)
		return p, nil
	}
	p.replay = zmq4.NewRouter(ctx, guarded(logger)...)
	if err := p.replay.Listen(zmtpguard.Endpoint(cfg.ReplayEndpoint)); err != nil {
		cancel()
		_ = p.replay.Close()
		_ = p.pub.Close()
		return nil, fmt.Errorf("kv events replay ROUTER %s: %w", cfg.ReplayEndpoint, err)
	}
	go p.serveReplay()
	return p, nil
}

// Addr is the PUB socket's bound address (nil when it connects).
func (p *Publisher) Addr() net.Addr { return p.pub.Addr() }

// ReplayAddr is the replay socket's bound address, nil without one.
func (p *Publisher) ReplayAddr() net.Addr {
	if p.replay == nil {
		return nil
	}
	return p.replay.Addr()
}

// Subscribed reports whether a connected subscriber has subscribed to a
// prefix of topic. ZMQ drops what a PUB sends before the subscription
// arrives, so a caller that must not miss the first batches waits for this.
func (p *Publisher) Subscribed(topic string) bool {
	t, ok := p.pub.(zmq4.Topics)
	if !ok {
		return false
	}
	return slices.ContainsFunc(t.Topics(), func(sub string) bool { return strings.HasPrefix(topic, sub) })
}

// Publish sends events as one batch stamped with the current time. It does
// not block on subscribers: ZMQ queues the message, as an engine's publisher
// thread does, and a batch that cannot be encoded is logged and dropped
// without consuming a sequence number.
func (p *Publisher) Publish(events []Event) {
	rank := p.cfg.DPRank
	b := Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: events, DPRank: &rank}
	payload, err := Encode(b, p.cfg.Encoding)
	if err != nil {
		p.log.Error("kv events: encoding a batch", "err", err)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	seq := p.next
	p.next++
	// Sending under the lock keeps sequence numbers in wire order.
	if p.unsent > 0 {
		p.unsent--
	} else if err := p.pub.Send(zmq4.NewMsgFrom([]byte(p.cfg.Topic), SeqBytes(seq), payload)); err != nil {
		p.log.Warn("kv events: publishing", "seq", seq, "err", err)
	}
	if len(p.ring) < p.cfg.Buffer {
		p.ring = append(p.ring, stored{seq: seq, payload: payload})
	} else {
		p.ring[p.head] = stored{seq: seq, payload: payload}
		p.head = (p.head + 1) % len(p.ring)
	}
}

// DropNext makes the next n batches go to the replay buffer only, as if
// the network had lost them: for tests and benchmarks of a consumer's gap
// handling.
func (p *Publisher) DropNext(n int) {
	p.mu.Lock()
	p.unsent = max(n, 0)
	p.mu.Unlock()
}

// Close stops the replay loop and closes both sockets. It is idempotent.
// zmq4 (v0.17.0) leaves one idle goroutine behind per closed PUB socket.
func (p *Publisher) Close() error {
	p.mu.Lock()
	already := p.closed
	p.closed = true
	p.mu.Unlock()
	if already {
		return nil
	}
	p.cancel()
	err := p.pub.Close()
	if p.replay != nil {
		if rerr := p.replay.Close(); err == nil {
			err = rerr
		}
	}
	<-p.done
	closeLate(p.pub)
	if p.replay != nil {
		closeLate(p.replay)
	}
	return err
}

// lateConnGrace is how long closeLate waits for a connection whose
// handshake was under way when its socket closed.
const lateConnGrace = 100 * time.Millisecond

// closeLate closes a closed socket again after lateConnGrace: zmq4
// (v0.17.0) adds a connection accepted or dialled while Close runs after
// Close has closed the others, and nothing would ever close it (its reader
// goroutines and file descriptor would leak). A second Close closes what
// was added since; a handshake with a live peer takes far less than the
// grace.
func closeLate(s zmq4.Socket) {
	time.Sleep(lateConnGrace)
	_ = s.Close()
}

// serveReplay answers replay requests until the socket is closed. A REQ
// client's request is [identity, "", start]; a DEALER may omit the empty
// delimiter. Answers use the same envelope.
func (p *Publisher) serveReplay() {
	defer close(p.done)
	for {
		msg, err := p.replay.Recv()
		if err != nil {
			return // closed
		}
		p.serveRequest(msg.Frames)
	}
}

// serveRequest answers one replay request. It survives a panic: the
// request comes from a peer.
func (p *Publisher) serveRequest(frames [][]byte) {
	defer func() {
		if r := recover(); r != nil {
			p.log.Error("kv events: panic answering a replay request", "panic", r, "stack", string(debug.Stack()))
		}
	}()
	if len(frames) < 2 || len(frames) > 3 || (len(frames) == 3 && len(frames[1]) != 0) {
		p.log.Warn("kv events: invalid replay request", "frames", len(frames))
		return
	}
	start, err := ParseSeq(frames[len(frames)-1])
	if err != nil {
		p.log.Warn("kv events: invalid replay request", "err", err)
		return
	}
	envelope := frames[:len(frames)-1]
	for _, b := range p.since(start) {
		if !p.answer(envelope, SeqBytes(b.seq), b.payload) {
			break
		}
	}
	p.answer(envelope, SeqBytes(EndOfReplay), nil)
}

func (p *Publisher) answer(envelope [][]byte, seq, payload []byte) bool {
	frames := append(slices.Clone(envelope), seq, payload)
	if err := p.replay.Send(zmq4.NewMsgFrom(frames...)); err != nil {
		p.log.Warn("kv events: replay answer", "err", err)
		return false
	}
	return true
}

// since returns the buffered batches with a sequence number at least start.
func (p *Publisher) since(start int64) []stored {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []stored
	for i := range p.ring {
		if b := p.ring[(p.head+i)%len(p.ring)]; b.seq >= start {
			out = append(out, b)
		}
	}
	return out
}
