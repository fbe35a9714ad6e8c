package daemon_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// An operator's first worker write on a node that is bootstrapping waits
// for the seed of the config's workers (daemon wires the seed into the
// service's WorkerWritesAfter): written first, it made the seed see a
// worker history and skip them, and the node listed only the worker added.
// The add is sent from the moment the API answers, to land as early as a
// script's would.
func TestFirstWorkerWriteKeepsTheConfigsWorkers(t *testing.T) {
	w1, w2, w3 := replica(t, "w1"), replica(t, "w2"), replica(t, "w3")
	nodes := layoutNodes(t, 1, nodeOpts{workers: []string{w1, w2}})
	n := nodes[0]
	n.Start(t)
	add := connect.NewRequest(&cartv1.AddWorkerRequest{Worker: &cartv1.Worker{Url: w3, MaxLoad: 5}})
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := n.admin().AddWorker(ctx, add)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("add worker: %v", err)
		}
		time.Sleep(5 * time.Millisecond) // not up or not leading yet
	}
	waitWorkers(t, nodes, []string{w1, w2, w3}, "the config's workers and the added one")
}
