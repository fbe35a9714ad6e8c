package kvevents

import (
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
)

// A consumer that replaces another (a new control-plane leader) receives
// the publisher's batches.
func TestSecondSubscriberReceives(t *testing.T) {
	for i := range 3 {
		p := newPublisher(t, PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:0"})
		first := &recSink{}
		s1 := connected(t, p, "", first)
		p.Publish(storedEv(1))
		first.waitLen(t, 1)
		_ = s1.Close()
		second := &recSink{}
		s2, err := NewSubscriber(SubscriberConfig{Endpoint: "tcp://" + p.Addr().String(),
			Topics: map[string]Route{"": {Worker: "w", ReplayEndpoint: "tcp://" + p.ReplayAddr().String()}},
			Sink:   func(string, int) StreamSink { return second }})
		if err != nil {
			t.Fatal(err)
		}
		ok, msg := testkit.Poll(5*time.Second, func() (bool, string) {
			p.Publish(storedEv(2))
			got := second.entries()
			return len(got) > 0, ""
		})
		_ = s2.Close()
		if !ok {
			t.Fatalf("round %d: the second subscriber received nothing %s", i, msg)
		}
	}
}
