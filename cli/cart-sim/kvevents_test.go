package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/kvevents"
	"github.com/cartrouter/cart/sim"
)

// receive runs sck.Recv in a goroutine until the socket is closed.
func receive(t *testing.T, sck zmq4.Socket) <-chan zmq4.Msg {
	msgs := make(chan zmq4.Msg, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := sck.Recv()
			if err != nil {
				return
			}
			msgs <- m
		}
	}()
	t.Cleanup(func() {
		_ = sck.Close()
		<-done
	})
	return msgs
}

// TestReplicaPublishesKVEvents runs a replica with a publisher and checks,
// from a ZMQ subscriber, that a request's stored blocks and a reset arrive
// in sequence, and that the replay socket returns them again.
func TestReplicaPublishesKVEvents(t *testing.T) {
	pub, err := kvevents.NewPublisher(kvevents.PublisherConfig{
		Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv@sim@m", Encoding: kvevents.EncodingArray,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })

	sub := zmq4.NewSub(context.Background())
	if err := sub.Dial("tcp://" + pub.Addr().String()); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, "kv@"); err != nil {
		t.Fatal(err)
	}
	msgs := receive(t, sub)
	deadline := time.Now().Add(10 * time.Second)
	for !pub.Subscribed("kv@sim@m") {
		if time.Now().After(deadline) {
			t.Fatal("subscription never reached the publisher")
		}
		time.Sleep(2 * time.Millisecond)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := sim.Config{Name: "kv", TimeScale: 0}
	done := make(chan error, 1)
	go func() { done <- serveListener(ctx, ln, pub, cfg, io.Discard) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	base := "http://" + ln.Addr().String()
	// 40 token ids: two full 16-token blocks are stored.
	body := `{"prompt":[` + strings.Repeat("7,", 39) + `7],"max_tokens":1}`
	resp, err := client.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("completion: %d", resp.StatusCode)
	}
	var live []kvevents.Message
	m, err := kvevents.ParseMessage(testkit.Recv(t, msgs, 10*time.Second, "a message").Frames)
	if err != nil {
		t.Fatal(err)
	}
	b, err := kvevents.Decode(m.Payload)
	if err != nil || m.Topic != "kv@sim@m" || m.Seq != 0 || len(b.Events) != 1 {
		t.Fatalf("first message %+v %+v %v", m, b, err)
	}
	stored := b.Events[0]
	if stored.Kind != kvevents.BlockStored || len(stored.BlockHashes) != 2 || len(stored.TokenIDs) != 32 || stored.TokenIDs[31] != 7 || stored.BlockSize != 16 {
		t.Fatalf("stored event %+v", stored)
	}
	live = append(live, m)

	resp, err = client.Post(base+"/sim/reset", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	m, err = kvevents.ParseMessage(testkit.Recv(t, msgs, 10*time.Second, "a message").Frames)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := kvevents.Decode(m.Payload); err != nil || m.Seq != 1 || len(b.Events) != 1 || b.Events[0].Kind != kvevents.AllBlocksCleared {
		t.Fatalf("reset message %+v %+v %v", m, b, err)
	}
	live = append(live, m)

	dealer := zmq4.NewDealer(context.Background(), zmq4.WithID(zmq4.SocketIdentity("catch-up")))
	if err := dealer.Dial("tcp://" + pub.ReplayAddr().String()); err != nil {
		t.Fatal(err)
	}
	answers := receive(t, dealer)
	if err := dealer.Send(zmq4.NewMsgFrom([]byte{}, kvevents.SeqBytes(0))); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		f := testkit.Recv(t, answers, 10*time.Second, "an answer").Frames
		if len(f) != 3 || len(f[0]) != 0 {
			t.Fatalf("replay answer frames %q", f)
		}
		seq, err := kvevents.ParseSeq(f[1])
		if err != nil {
			t.Fatal(err)
		}
		if seq == kvevents.EndOfReplay {
			if i != len(live) {
				t.Fatalf("replay returned %d batches, want %d", i, len(live))
			}
			break
		}
		if i >= len(live) || seq != live[i].Seq || !bytes.Equal(f[2], live[i].Payload) {
			t.Fatalf("replayed batch %d: seq %d", i, seq)
		}
	}
}
