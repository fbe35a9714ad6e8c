package service

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// On a node bootstrapping a new cluster, an operator's first worker
// writes wait until the config's workers are seeded: applied first, they
// would make the seed see a worker history and skip the config (found as
// a node listing only the worker added right after the election).
func TestWorkerWritesWaitForTheSeed(t *testing.T) {
	seeded := make(chan struct{})
	cp := newTestCP(t, cpConfig{leader: true, opts: func(o *Options) { o.WorkerWritesAfter = seeded }})
	admin := cp.admin()
	add := func(ctx context.Context, url string) error {
		_, err := admin.AddWorker(ctx, connect.NewRequest(&cartv1.AddWorkerRequest{Worker: &cartv1.Worker{Url: url}}))
		return err
	}

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := add(ctx, "http://10.0.0.9:8000"); connect.CodeOf(err) != connect.CodeUnavailable && connect.CodeOf(err) != connect.CodeDeadlineExceeded {
		t.Fatalf("a worker write before the seed: %v, want it held until its deadline", err)
	}
	// Update and remove of a worker the seed may bring are held too.
	for name, m := range map[string]func(context.Context) error{
		"update": func(ctx context.Context) error {
			_, err := admin.UpdateWorker(ctx, connect.NewRequest(&cartv1.UpdateWorkerRequest{Worker: &cartv1.Worker{Url: "http://10.0.0.1:8000", MaxLoad: 3}}))
			return err
		},
		"remove": func(ctx context.Context) error {
			_, err := admin.RemoveWorker(ctx, connect.NewRequest(&cartv1.RemoveWorkerRequest{Url: "http://10.0.0.1:8000"}))
			return err
		},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		err := m(ctx)
		cancel()
		if code := connect.CodeOf(err); code != connect.CodeUnavailable && code != connect.CodeDeadlineExceeded {
			t.Fatalf("%s before the seed: %v, want it held until its deadline", name, err)
		}
	}
	if ws, _ := cp.st.Workers(); len(ws) != 0 {
		t.Fatalf("workers written before the seed: %v", ws)
	}

	// The seed lands, then the gate opens: the write held meanwhile goes
	// through after it, and both are in the set.
	done := make(chan error, 1)
	go func() { done <- add(context.Background(), "http://10.0.0.9:8000") }()
	time.Sleep(50 * time.Millisecond)
	cp.addWorkers(t, "http://10.0.0.1:8000", "http://10.0.0.2:8000")
	close(seeded)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the held write after the seed: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the held write never went through")
	}
	ws, _ := cp.st.Workers()
	if len(ws) != 3 {
		t.Fatalf("worker set after the seed and the held add: %v, want all three", ws)
	}
}
