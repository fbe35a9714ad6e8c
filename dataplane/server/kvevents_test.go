package server_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/kvevents"
	"github.com/cartrouter/cart/sim"
	"github.com/cartrouter/cart/sim/simtest"
)

// The all-in-one router consumes a cart-sim replica's KV events: /workers
// shows the engine's occupancy, the replica's cache reset stops it being a
// holder, and a reload that changes kv_events is refused (read at start).
func TestAllInOneConsumesKVEvents(t *testing.T) {
	pub, err := kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	engine := simtest.Start(t, sim.Config{Model: "cart-sim", BlockTokens: 16, KVEvents: pub})
	other := newReplica(t, "other")

	kv := fmt.Sprintf("kv_events: {endpoint: \"tcp://%s\", replay_endpoint: \"tcp://%s\"}", pub.Addr(), pub.ReplayAddr())
	paths := configFiles(t, workersYAML(engine.URL+";"+kv, other.URL+";load_penalty: 50"))
	a := newAllInOne(t, paths)
	base := runAllInOne(t, a)
	testkit.WaitFor(t, 10*time.Second, "the subscription", func() bool { return pub.Subscribed("") })

	prompt := longText("kv events prefix", 3000)
	if code, peer, _ := chat(t, base, chatBody(prompt, "q", false, 1)); code != http.StatusOK || peer != engine.URL {
		t.Fatalf("first request: %d via %s", code, peer)
	}
	testkit.WaitForMsg(t, 10*time.Second, "the engine's occupancy in /workers", func() (bool, string) {
		w := workers(t, base)[engine.URL]
		return w.KVEvents != nil && w.KVEvents.OccupiedTokens > 0, fmt.Sprintf("%+v", w.KVEvents)
	})
	if w := workers(t, base)[other.URL]; w.KVEvents != nil {
		t.Fatalf("a worker without events shows %+v", w.KVEvents)
	}

	writeFile(t, paths[1], workersYAML(engine.URL, other.URL+";load_penalty: 50"))
	if err := a.Reload(); err == nil || !strings.Contains(err.Error(), "kv_events") {
		t.Fatalf("reload dropping kv_events: %v", err)
	}
}
