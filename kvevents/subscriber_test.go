package kvevents

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
)

// recSink records what a stream's sink is told, as strings in order.
type recSink struct {
	mu  sync.Mutex
	log []string
}

func (r *recSink) add(s string) {
	r.mu.Lock()
	r.log = append(r.log, s)
	r.mu.Unlock()
}

func (r *recSink) Batch(b Batch, synced bool) {
	for _, ev := range b.Events {
		h := uint64(0)
		if len(ev.BlockHashes) > 0 {
			h = ev.BlockHashes[0]
		}
		r.add(fmt.Sprintf("%s:%d:%v", ev.Kind, h, synced))
	}
}
func (r *recSink) Restarted()              { r.add("restarted") }
func (r *recSink) Replayed(from, to int64) { r.add(fmt.Sprintf("replayed:%d-%d", from, to)) }
func (r *recSink) Lost(from, to int64)     { r.add(fmt.Sprintf("lost:%d-%d", from, to)) }

func (r *recSink) entries() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.log)
}

func (r *recSink) waitLen(t *testing.T, n int) []string {
	t.Helper()
	testkit.WaitForMsg(t, 10*time.Second, "sink entries", func() (bool, string) {
		got := r.entries()
		return len(got) >= n, fmt.Sprint(got)
	})
	return r.entries()
}

// want waits until the sink holds as many entries as want and checks them.
func (r *recSink) want(t *testing.T, want ...string) {
	t.Helper()
	if got := r.waitLen(t, len(want)); !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func storedEv(h uint64) []Event {
	return []Event{{Kind: BlockStored, BlockHashes: []uint64{h}, TokenIDs: []uint32{1, 2}, BlockSize: 2, Medium: MediumGPU}}
}

func newSubscriber(t *testing.T, cfg SubscriberConfig) *Subscriber {
	t.Helper()
	s, err := NewSubscriber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// connected starts a subscriber dialling p and waits until p sees its
// subscription, so that no batch published afterwards is dropped.
func connected(t *testing.T, p *Publisher, topic string, sink StreamSink) *Subscriber {
	t.Helper()
	replay := ""
	if p.ReplayAddr() != nil {
		replay = "tcp://" + p.ReplayAddr().String()
	}
	s := newSubscriber(t, SubscriberConfig{
		Endpoint: "tcp://" + p.Addr().String(),
		Topics:   map[string]Route{topic: {Worker: "http://w1", ReplayEndpoint: replay}},
		Sink:     func(string, int) StreamSink { return sink },
	})
	testkit.WaitFor(t, 10*time.Second, "the subscription", func() bool { return p.Subscribed(topic) })
	return s
}

func TestSubscriberReceivesBothEncodingsInOrder(t *testing.T) {
	for _, enc := range []Encoding{EncodingMap, EncodingArray} {
		t.Run(enc.String(), func(t *testing.T) {
			p := newPublisher(t, PublisherConfig{Topic: "kv@10.0.0.1@m", Encoding: enc})
			sink := &recSink{}
			connected(t, p, "kv@10.0.0.1@m", sink)
			p.Publish(storedEv(7))
			p.Publish([]Event{{Kind: BlockRemoved, BlockHashes: []uint64{7}}})
			p.Publish(cleared())
			sink.want(t, "BlockStored:7:true", "BlockRemoved:7:true", "AllBlocksCleared:0:true")
		})
	}
}

func TestSubscriberReplaysAGap(t *testing.T) {
	p := newPublisher(t, PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:0"})
	sink := &recSink{}
	connected(t, p, "", sink)
	p.Publish(storedEv(1))
	sink.waitLen(t, 1)
	p.mu.Lock()
	p.unsent = 2 // seq 1 and 2 never reach the subscriber
	p.mu.Unlock()
	p.Publish(storedEv(2))
	p.Publish(storedEv(3))
	p.Publish(storedEv(4))
	sink.want(t, "BlockStored:1:true", "BlockStored:2:true", "BlockStored:3:true", "replayed:1-3", "BlockStored:4:true")
}

// A subscriber that joins a running publisher knows the stream from the
// first batch it sees: it asks for no replay of what came before.
func TestSubscriberJoiningLateIsKnownFromTheFirstBatch(t *testing.T) {
	p := newPublisher(t, PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:0"})
	// Buffered only, as if published before anyone subscribed: zmq4's PUB
	// socket writes from a goroutine of its own, so a batch published
	// before the subscription may still reach a subscriber that joins just
	// after.
	p.DropNext(2)
	p.Publish(storedEv(1))
	p.Publish(storedEv(2))
	sink := &recSink{}
	connected(t, p, "", sink)
	p.Publish(storedEv(3))
	p.Publish(storedEv(4))
	sink.want(t, "BlockStored:3:true", "BlockStored:4:true")
}

func TestSubscriberGapBeyondReplayIsLost(t *testing.T) {
	p := newPublisher(t, PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:0", Buffer: 2})
	sink := &recSink{}
	connected(t, p, "", sink)
	p.Publish(storedEv(1))
	sink.waitLen(t, 1)
	p.mu.Lock()
	p.unsent = 4 // seq 1-4 lost; the buffer keeps only 3 and 4 (then 4, 5)
	p.mu.Unlock()
	for h := uint64(2); h <= 6; h++ {
		p.Publish(storedEv(h))
	}
	// Seq 1-4 are missing and the buffer starts at 4: nothing can be
	// applied out of order, so all four are lost and the stream is no
	// longer synced.
	sink.want(t, "BlockStored:1:true", "lost:1-5", "BlockStored:6:false")
	// A clear does not make it synced by itself (the sink decides); the
	// stream stays unsynced until the publisher restarts.
	p.Publish(cleared())
	if got := sink.waitLen(t, 4); got[3] != "AllBlocksCleared:0:false" {
		t.Fatalf("got %v", got)
	}
}

func TestSubscriberWithoutReplayLosesTheGap(t *testing.T) {
	p := newPublisher(t, PublisherConfig{})
	sink := &recSink{}
	connected(t, p, "", sink)
	p.Publish(storedEv(1))
	sink.waitLen(t, 1)
	p.DropNext(1)
	p.Publish(storedEv(2))
	p.Publish(storedEv(3))
	sink.want(t, "BlockStored:1:true", "lost:1-2", "BlockStored:3:false")
}

// The llm-d layout: CART binds, engines dial; a publisher that restarts
// starts again at 0, and the topic names the engine.
func TestSubscriberListenRoutesTopicsAndDetectsRestart(t *testing.T) {
	sinks := map[string]*recSink{"http://a": {}, "http://b": {}}
	s := newSubscriber(t, SubscriberConfig{
		Endpoint: "tcp://127.0.0.1:0",
		Listen:   true,
		Topics:   map[string]Route{"kv@a@m": {Worker: "http://a", PayloadRank: true}, "kv@b@m": {Worker: "http://b", PayloadRank: true}},
		Sink:     func(w string, _ int) StreamSink { return sinks[w] },
	})
	ep := "tcp://" + s.Addr().String()
	a := newPublisher(t, PublisherConfig{Endpoint: ep, Connect: true, Topic: "kv@a@m"})
	b := newPublisher(t, PublisherConfig{Endpoint: ep, Connect: true, Topic: "kv@b@m", Encoding: EncodingArray})
	testkit.WaitFor(t, 10*time.Second, "subscriptions", func() bool { return a.Subscribed("kv@a@m") && b.Subscribed("kv@b@m") })
	a.Publish(storedEv(1))
	a.Publish(storedEv(2))
	b.Publish(storedEv(9))
	sinks["http://a"].waitLen(t, 2)
	sinks["http://b"].want(t, "BlockStored:9:true")
	_ = a.Close()
	a2 := newPublisher(t, PublisherConfig{Endpoint: ep, Connect: true, Topic: "kv@a@m"})
	testkit.WaitFor(t, 10*time.Second, "resubscription", func() bool { return a2.Subscribed("kv@a@m") })
	a2.Publish(storedEv(3))
	sinks["http://a"].want(t, "BlockStored:1:true", "BlockStored:2:true", "restarted", "BlockStored:3:true")
}

func TestSubscriberReplayFailureAndRanks(t *testing.T) {
	sink := &recSink{}
	var asked []string
	s := &Subscriber{
		cfg: SubscriberConfig{
			Topics: map[string]Route{"": {Worker: "w", ReplayEndpoint: "tcp://10.0.0.1:5558", PayloadRank: true}},
			Sink:   func(string, int) StreamSink { return sink },
			Replay: func(_ context.Context, ep string, from, to int64) ([]Message, error) {
				asked = append(asked, fmt.Sprintf("%s %d-%d", ep, from, to))
				return nil, errors.New("refused")
			},
			ReplayTimeout: time.Second,
		},
		log: discard(), ctx: context.Background(), streams: map[streamKey]*stream{}, lastRank: map[string]int{},
	}
	rank := 2
	payload, err := Encode(Batch{Events: storedEv(5), DPRank: &rank}, EncodingMap)
	if err != nil {
		t.Fatal(err)
	}
	s.handle(Message{Seq: 1, Payload: payload})
	s.handle(Message{Seq: 3, Payload: payload})
	s.handle(Message{Seq: 4, Payload: []byte{0xc1}}) // undecodable
	s.handle(Message{Seq: 5, Payload: payload})
	if want := []string{"tcp://10.0.0.1:5560 2-3"}; !slices.Equal(asked, want) {
		t.Fatalf("replay asked %v, want %v (rank 2 offsets the port by 2)", asked, want)
	}
	if got, want := sink.entries(), []string{"BlockStored:5:true", "lost:2-3", "BlockStored:5:false", "lost:4-5", "BlockStored:5:false"}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	// A socket of one rank (SGLang sends no rank in its batches) replays
	// from the endpoint it was given.
	asked = nil
	s.cfg.Topics[""] = Route{Worker: "w", ReplayEndpoint: "tcp://10.0.0.1:5559", Rank: 1}
	s.streams, s.lastRank = map[streamKey]*stream{}, map[string]int{}
	s.handle(Message{Seq: 0, Payload: payload})
	s.handle(Message{Seq: 2, Payload: payload})
	if want := []string{"tcp://10.0.0.1:5559 1-2"}; !slices.Equal(asked, want) {
		t.Fatalf("replay asked %v, want %v", asked, want)
	}
}

func TestOffsetPort(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"tcp://h:5557", 0, "tcp://h:5557"},
		{"tcp://h:5557", 3, "tcp://h:5560"},
		{"tcp://[::1]:5557", 1, "tcp://[::1]:5558"},
		{"ipc:///tmp/x", 1, ""},
		{"tcp://h:65535", 1, ""},
		{"tcp://h:x", 1, ""},
	} {
		got, err := OffsetPort(c.in, c.n)
		if got != c.want || (err != nil) != (c.want == "") {
			t.Errorf("OffsetPort(%q, %d) = %q, %v", c.in, c.n, got, err)
		}
	}
}

func TestSubscriberConfigErrors(t *testing.T) {
	sink := func(string, int) StreamSink { return &recSink{} }
	for _, cfg := range []SubscriberConfig{
		{},
		{Endpoint: "tcp://127.0.0.1:0"},
		{Endpoint: "tcp://127.0.0.1:0", Topics: map[string]Route{"": {}}},
		{Endpoint: "bogus://x", Listen: true, Topics: map[string]Route{"": {}}, Sink: sink},
	} {
		if s, err := NewSubscriber(cfg); err == nil {
			_ = s.Close()
			t.Errorf("%+v accepted", cfg)
		}
	}
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// An engine that restarts on the same port (CART dials it) is dialled
// again, and its sequence starting over reads as a restart.
func TestSubscriberRedialsARestartedEngine(t *testing.T) {
	p := newPublisher(t, PublisherConfig{})
	ep := p.Addr().String()
	sink := &recSink{}
	connected(t, p, "", sink)
	p.Publish(storedEv(1))
	p.Publish(storedEv(2))
	sink.waitLen(t, 2)
	_ = p.Close()
	var p2 *Publisher
	testkit.WaitFor(t, 10*time.Second, "the port free again", func() bool {
		var err error
		p2, err = NewPublisher(PublisherConfig{Endpoint: "tcp://" + ep})
		return err == nil
	})
	t.Cleanup(func() { _ = p2.Close() })
	testkit.WaitFor(t, 10*time.Second, "the subscriber back", func() bool { return p2.Subscribed("") })
	p2.Publish(storedEv(3))
	sink.want(t, "BlockStored:1:true", "BlockStored:2:true", "restarted", "BlockStored:3:true")
}

// A replay whose buffer starts past the requested sequence stops at its
// first answer: the gap cannot be filled, the rest is not read.
func TestReplayFromStopsWhenTheBufferStartsLater(t *testing.T) {
	p := newPublisher(t, PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:0", Buffer: 3})
	for range 6 {
		p.Publish(cleared())
	}
	ep := "tcp://" + p.ReplayAddr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := ReplayFrom(ctx, ep, 0, 6)
	if err != nil || len(got) != 1 || got[0].Seq != 3 {
		t.Fatalf("replay from 0 of a buffer holding 3-5: %+v, %v", got, err)
	}
	got, err = ReplayFrom(ctx, ep, 3, 5)
	if err != nil || len(got) != 2 || got[0].Seq != 3 || got[1].Seq != 4 {
		t.Fatalf("replay 3-5: %+v, %v", got, err)
	}
}

func TestParseReplayAnswer(t *testing.T) {
	seq, end := SeqBytes(7), SeqBytes(EndOfReplay)
	for _, c := range []struct {
		name   string
		frames [][]byte
		seq    int64
		ok     bool
	}{
		{"REQ-style (vLLM to a REQ)", [][]byte{seq, []byte("p")}, 7, true},
		{"vLLM to a DEALER: delimiter", [][]byte{{}, seq, []byte("p")}, 7, true},
		{"llm-d-inference-sim: delimiter and topic", [][]byte{{}, []byte("kv@a@m"), seq, []byte("p")}, 7, true},
		{"sim end marker: empty topic and payload", [][]byte{{}, {}, end, {}}, EndOfReplay, true},
		{"vLLM end marker", [][]byte{{}, end, {}}, EndOfReplay, true},
		{"one frame", [][]byte{seq}, 0, false},
		{"short sequence", [][]byte{{}, {1, 2}, []byte("p")}, 0, false},
	} {
		m, err := ParseReplayAnswer(c.frames)
		if (err == nil) != c.ok || (c.ok && m.Seq != c.seq) {
			t.Errorf("%s: %+v, %v", c.name, m, err)
		}
	}
}

// A panic while handling one message (here the sink's) is recovered: the
// topic's streams count as lost, and the next batch is handled.
func TestSubscriberSurvivesAPanickingSink(t *testing.T) {
	sink := &recSink{}
	panicky := &panicSink{recSink: sink, left: 1}
	s := &Subscriber{
		cfg: SubscriberConfig{Topics: map[string]Route{"": {Worker: "w"}}, Sink: func(string, int) StreamSink { return panicky }},
		log: discard(), ctx: context.Background(), streams: map[streamKey]*stream{}, lastRank: map[string]int{},
	}
	payload, err := Encode(Batch{Events: storedEv(1)}, EncodingMap)
	if err != nil {
		t.Fatal(err)
	}
	s.handleSafely(Message{Seq: 0, Payload: payload})
	s.handleSafely(Message{Seq: 1, Payload: payload})
	if got, want := sink.entries(), []string{"lost:1-2", "BlockStored:1:false"}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

type panicSink struct {
	*recSink
	left int
}

func (p *panicSink) Batch(b Batch, synced bool) {
	if p.left > 0 {
		p.left--
		panic("sink bug")
	}
	p.recSink.Batch(b, synced)
}

// In the listen layout each rank a batch names is a stream with its own
// block set: ranks past the route's bound are dropped, not created.
func TestSubscriberBoundsPayloadRanks(t *testing.T) {
	sink := &recSink{}
	ranks := map[int]bool{}
	s := &Subscriber{
		cfg: SubscriberConfig{
			Topics: map[string]Route{"a": {Worker: "w", PayloadRank: true, MaxRanks: 2}, "b": {Worker: "v", PayloadRank: true}},
			Sink:   func(_ string, r int) StreamSink { ranks[r] = true; return sink },
		},
		log: discard(), ctx: context.Background(), streams: map[streamKey]*stream{}, lastRank: map[string]int{},
	}
	for _, c := range []struct {
		topic string
		rank  int
	}{{"a", 0}, {"a", 1}, {"a", 2}, {"a", -1}, {"b", DefaultMaxRanks - 1}, {"b", DefaultMaxRanks}, {"b", 1 << 30}} {
		payload, err := Encode(Batch{Events: storedEv(1), DPRank: &c.rank}, EncodingMap)
		if err != nil {
			t.Fatal(err)
		}
		s.handle(Message{Topic: c.topic, Payload: payload})
	}
	if len(s.streams) != 3 || !ranks[0] || !ranks[1] || !ranks[DefaultMaxRanks-1] {
		t.Fatalf("streams %v, ranks %v", s.streams, ranks)
	}
}

// FuzzSubscriberMessage: any frames a peer sends, through the parser and
// the sequence logic (with a replay that answers anything), never panic.
func FuzzSubscriberMessage(f *testing.F) {
	payload, _ := Encode(Batch{Events: storedEv(1)}, EncodingMap)
	f.Add([]byte("kv@a@m"), SeqBytes(3), payload, SeqBytes(1), payload)
	f.Add([]byte{}, SeqBytes(-5), []byte{0xc1}, SeqBytes(EndOfReplay), []byte{})
	f.Add([]byte("a"), SeqBytes(1<<62), testkit.ZMTPCrashingFrame(), []byte{1}, testkit.ZMTPCrashingFrame())
	f.Fuzz(func(t *testing.T, topic, seq, body, replaySeq, replayBody []byte) {
		sink := &recSink{}
		s := &Subscriber{
			cfg: SubscriberConfig{
				Topics: map[string]Route{"": {Worker: "w", ReplayEndpoint: "tcp://e:1", PayloadRank: true}},
				Sink:   func(string, int) StreamSink { return sink },
				Replay: func(_ context.Context, _ string, _, _ int64) ([]Message, error) {
					m, err := ParseReplayAnswer([][]byte{{}, replaySeq, replayBody})
					return []Message{m}, err
				},
			},
			log: discard(), ctx: context.Background(), streams: map[streamKey]*stream{}, lastRank: map[string]int{},
		}
		for _, frames := range [][][]byte{{topic, seq, body}, {topic, SeqBytes(0), body}, {topic, seq, payload}} {
			if m, err := ParseMessage(frames); err == nil {
				s.handle(m) // not handleSafely: a panic here is the bug to find
			}
		}
	})
}
