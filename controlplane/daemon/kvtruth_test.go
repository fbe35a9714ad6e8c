package daemon_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/kvevents"
	"github.com/cartrouter/cart/sim"
	"github.com/cartrouter/cart/sim/simtest"
)

// indexEntries reads cart_cp_index_entries from a node (-1 when it cannot).
func indexEntries(url string) float64 {
	if v, ok, err := testkit.MetricSample(nil, url+"/metrics", "cart_cp_index_entries"); ok && err == nil {
		return v
	}
	return -1
}

// Three real control-plane nodes with one engine publishing KV events: the
// leader consumes them, and the engine's cache reset empties every node's
// index through the log.
func TestLeaderConsumesKVEventsThroughTheLog(t *testing.T) {
	pub, err := kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	engine := simtest.Start(t, sim.Config{Name: "w1", Models: []string{"m"}, KVEvents: pub})

	// Every node that may lead knows the engine's event endpoints.
	procs := startCluster(t, nil, fmt.Sprintf("workers:\n  - url: %s\n    kv_events: {endpoint: \"tcp://%s\", replay_endpoint: \"tcp://%s\"}\n",
		engine.URL, pub.Addr(), pub.ReplayAddr()))

	placeAndClear := func(leader *node, live []*node, prompt string) {
		t.Helper()
		testkit.WaitFor(t, 15*time.Second, "the prompt routed", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, err := routerc(leader.url()).Route(ctx, connect.NewRequest(&cartv1.RouteRequest{Text: prompt, Model: "m", DataplaneId: "test"}))
			return err == nil
		})
		for _, p := range live {
			testkit.WaitForMsg(t, 15*time.Second, p.id+" holds the placement", func() (bool, string) {
				n := indexEntries(p.url())
				return n > 0, fmt.Sprint(n)
			})
		}
		resp, err := http.Post(engine.URL+"/sim/reset", "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		for _, p := range live {
			testkit.WaitForMsg(t, 15*time.Second, p.id+" dropped the cleared worker's holdings", func() (bool, string) {
				n := indexEntries(p.url())
				return n == 0, fmt.Sprint(n)
			})
		}
	}

	leader := waitLeader(t, procs, 15*time.Second)
	testkit.WaitFor(t, 15*time.Second, "the leader subscribed", func() bool { return pub.Subscribed("") })
	placeAndClear(leader, procs, strings.Repeat("a system prompt long enough for many blocks. ", 60))
}
