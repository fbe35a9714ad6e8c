package kvevents

import (
	"context"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
	"github.com/go-zeromq/zmq4"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testkit.IgnoreZMQPubWriter)
}

func newPublisher(t *testing.T, cfg PublisherConfig) *Publisher {
	t.Helper()
	if cfg.Endpoint == "" {
		cfg.Endpoint = "tcp://127.0.0.1:0"
	}
	p, err := NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// Subscriber is a SUB socket whose messages arrive on a channel, so a test
// can wait for one with a deadline.
type subscriber struct {
	sck  zmq4.Socket
	msgs chan zmq4.Msg
	done chan struct{}
}

func subscribe(t *testing.T, endpoint, topic string) *subscriber {
	t.Helper()
	s := &subscriber{sck: zmq4.NewSub(context.Background()), msgs: make(chan zmq4.Msg, 1024), done: make(chan struct{})}
	if err := s.sck.Dial(endpoint); err != nil {
		t.Fatal(err)
	}
	if err := s.sck.SetOption(zmq4.OptionSubscribe, topic); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(s.done)
		for {
			m, err := s.sck.Recv()
			if err != nil {
				return
			}
			s.msgs <- m
		}
	}()
	t.Cleanup(func() {
		_ = s.sck.Close()
		<-s.done
	})
	return s
}

func (s *subscriber) next(t *testing.T) Message {
	t.Helper()
	select {
	case m := <-s.msgs:
		msg, err := ParseMessage(m.Frames)
		if err != nil {
			t.Fatal(err)
		}
		return msg
	case <-time.After(10 * time.Second):
		t.Fatal("no kv event message within 10s")
	}
	return Message{}
}

func cleared() []Event { return []Event{{Kind: AllBlocksCleared}} }

func TestPublisherSendsFramesInSequence(t *testing.T) {
	for _, enc := range []Encoding{EncodingMap, EncodingArray} {
		t.Run(enc.String(), func(t *testing.T) {
			p := newPublisher(t, PublisherConfig{Topic: "kv@sim@m", Encoding: enc, DPRank: 1})
			sub := subscribe(t, "tcp://"+p.Addr().String(), "kv@")
			testkit.WaitFor(t, 10*time.Second, "the subscription", func() bool { return p.Subscribed("kv@sim@m") })

			stored := Event{Kind: BlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: MediumGPU}
			p.Publish([]Event{stored})
			p.Publish(cleared())
			for want := range int64(2) {
				m := sub.next(t)
				if m.Topic != "kv@sim@m" || m.Seq != want {
					t.Fatalf("message %d: topic %q seq %d", want, m.Topic, m.Seq)
				}
				b, err := Decode(m.Payload)
				if err != nil || b.DPRank == nil || *b.DPRank != 1 || len(b.Events) != 1 || b.TS < float64(time.Now().Add(-time.Minute).Unix()) {
					t.Fatalf("batch %+v (%v)", b, err)
				}
				if want == 0 && (b.Events[0].Kind != BlockStored || b.Events[0].BlockHashes[1] != 2) {
					t.Fatalf("first batch %+v", b)
				}
			}
		})
	}
}

// replayFrom asks for the batches from start and returns them.
func replayFrom(t *testing.T, endpoint string, start int64, withDelimiter bool) []Message {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// No fixed identity: zmq4's ROUTER answers the first connection whose
	// identity matches, and a previous call's closing connection with the
	// same identity would take part of this answer.
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial(endpoint); err != nil {
		t.Fatal(err)
	}
	req := [][]byte{SeqBytes(start)}
	if withDelimiter {
		req = [][]byte{{}, SeqBytes(start)}
	}
	if err := d.Send(zmq4.NewMsgFrom(req...)); err != nil {
		t.Fatal(err)
	}
	var out []Message
	for {
		type result struct {
			m   zmq4.Msg
			err error
		}
		got := make(chan result, 1)
		go func() {
			m, err := d.Recv()
			got <- result{m, err}
		}()
		var r result
		select {
		case r = <-got:
		case <-time.After(10 * time.Second):
			cancel()
			<-got
			t.Fatal("replay did not answer within 10s")
		}
		if r.err != nil {
			t.Fatal(r.err)
		}
		frames := r.m.Frames
		if withDelimiter {
			if len(frames) != 3 || len(frames[0]) != 0 {
				t.Fatalf("answer frames %q", frames)
			}
			frames = frames[1:]
		}
		if len(frames) != 2 {
			t.Fatalf("answer has %d frames", len(frames))
		}
		seq, err := ParseSeq(frames[0])
		if err != nil {
			t.Fatal(err)
		}
		if seq == EndOfReplay {
			if len(frames[1]) != 0 {
				t.Fatal("end of replay carries a payload")
			}
			return out
		}
		out = append(out, Message{Seq: seq, Payload: frames[1]})
	}
}

func TestReplayReturnsBufferedBatches(t *testing.T) {
	p := newPublisher(t, PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:0", Buffer: 3})
	replay := "tcp://" + p.ReplayAddr().String()
	if got := replayFrom(t, replay, 0, true); len(got) != 0 {
		t.Fatalf("replay before any batch: %d", len(got))
	}
	for range 5 { // nobody subscribed: the batches only reach the buffer
		p.Publish(cleared())
	}
	got := replayFrom(t, replay, 0, true)
	if len(got) != 3 || got[0].Seq != 2 || got[2].Seq != 4 {
		t.Fatalf("replay from 0 kept %+v, want the last 3 of 5", got)
	}
	if b, err := Decode(got[0].Payload); err != nil || b.Events[0].Kind != AllBlocksCleared {
		t.Fatalf("replayed payload %+v %v", b, err)
	}
	if got := replayFrom(t, replay, 4, false); len(got) != 1 || got[0].Seq != 4 {
		t.Fatalf("replay from 4 without delimiter: %+v", got)
	}
	if got := replayFrom(t, replay, 9, true); len(got) != 0 {
		t.Fatalf("replay past the end: %+v", got)
	}
}

func TestPublisherConfigAndClose(t *testing.T) {
	if _, err := NewPublisher(PublisherConfig{}); err == nil {
		t.Fatal("no endpoint accepted")
	}
	if _, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Buffer: -1}); err == nil {
		t.Fatal("negative buffer accepted")
	}
	if _, err := NewPublisher(PublisherConfig{Endpoint: "bogus://x"}); err == nil {
		t.Fatal("bad endpoint accepted")
	}
	p := newPublisher(t, PublisherConfig{})
	if p.ReplayAddr() != nil {
		t.Fatal("replay address without a replay socket")
	}
	if _, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://" + p.Addr().String()}); err == nil {
		t.Fatal("a replay endpoint already in use was accepted")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p.Publish(cleared()) // after Close: dropped, no panic
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	// The llm-d layout: the consumer binds, the publisher connects.
	sub := zmq4.NewSub(context.Background())
	defer sub.Close()
	if err := sub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	c := newPublisher(t, PublisherConfig{Endpoint: "tcp://" + sub.Addr().String(), Connect: true})
	if c.Addr() != nil {
		t.Fatal("a connecting publisher reports a bound address")
	}
}
