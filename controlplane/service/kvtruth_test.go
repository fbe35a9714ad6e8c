package service

import (
	"context"
	"testing"

	"connectrpc.com/connect"

	"github.com/cartrouter/cart/controlplane/decider"
	"github.com/cartrouter/cart/controlplane/engine"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// ListWorkers (and so Sync, data planes' /workers and cartctl) carries the
// cache a worker's engine reports while its KV events drive the model.
func TestListWorkersReportsTheEngineCache(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true})
	cp.addWorkers(t, "http://a.test:8000", "http://b.test:8000")
	cp.dec.Do(decider.OpKV, func(eng *engine.Engine) {
		eng.ApplyKVReport("http://a.test:8000", engine.KVReport{Synced: true, OccupiedBlocks: 10, CapacityBlocks: 20, OccupiedTokens: 160, CapacityTokens: 320}, nil)
	})
	list, err := cp.admin().ListWorkers(context.Background(), connect.NewRequest(&cartv1.ListWorkersRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*cartv1.KVCache{}
	for _, w := range list.Msg.GetWorkers() {
		got[w.GetUrl()] = w.GetKvCache()
	}
	if k := got["http://a.test:8000"]; k.GetOccupiedTokens() != 160 || k.GetCapacityTokens() != 320 {
		t.Fatalf("a: %v", k)
	}
	if k := got["http://b.test:8000"]; k != nil {
		t.Fatalf("b without events: %v", k)
	}
}
