package service

import (
	"context"
	"testing"

	"connectrpc.com/connect"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// ListWorkers (and so Sync and cartctl) reports each worker's source and
// whether the leader drains it; cartctl adds are tagged admin, and an
// update keeps a discovered worker's source, so discovery still owns it.
func TestListWorkersReportsSourceAndDraining(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true})
	ctx := context.Background()
	cmd := &cartv1.RaftCommand{Body: &cartv1.RaftCommand_UpsertWorker{UpsertWorker: &cartv1.UpsertWorkerCommand{
		Worker: &cartv1.WorkerSpec{Url: "http://d.test:8000", Source: "dns"}}}}
	if _, err := cp.node.Apply(ctx, cmd); err != nil {
		t.Fatal(err)
	}
	ac := cp.admin()
	if _, err := ac.AddWorker(ctx, connect.NewRequest(&cartv1.AddWorkerRequest{Worker: &cartv1.Worker{Url: "http://a.test:8000"}})); err != nil {
		t.Fatal(err)
	}
	if _, err := ac.UpdateWorker(ctx, connect.NewRequest(&cartv1.UpdateWorkerRequest{Worker: &cartv1.Worker{Url: "http://d.test:8000", MaxLoad: 3}})); err != nil {
		t.Fatal(err)
	}
	cp.dec.SetDraining("http://d.test:8000", true)
	list, err := ac.ListWorkers(ctx, connect.NewRequest(&cartv1.ListWorkersRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*cartv1.Worker{}
	for _, w := range list.Msg.GetWorkers() {
		got[w.GetUrl()] = w
	}
	if d := got["http://d.test:8000"]; d.GetSource() != "dns" || !d.GetDraining() || d.GetMaxLoad() != 3 {
		t.Errorf("discovered worker = %v, want source dns, draining, max_load 3", d)
	}
	if a := got["http://a.test:8000"]; a.GetSource() != "admin" || a.GetDraining() {
		t.Errorf("cartctl worker = %v, want source admin, not draining", a)
	}
}

// A Route answer names its worker's source, so that a data plane sends the
// pool's worker key only to workers of sources it trusts with it.
func TestRouteNamesWorkerSource(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true})
	cmd := &cartv1.RaftCommand{Body: &cartv1.RaftCommand_UpsertWorker{UpsertWorker: &cartv1.UpsertWorkerCommand{
		Worker: &cartv1.WorkerSpec{Url: "http://d.test:8000", Source: "dns"}}}}
	if _, err := cp.node.Apply(context.Background(), cmd); err != nil {
		t.Fatal(err)
	}
	if d := route(t, cp.router(), &cartv1.RouteRequest{Text: "hello", DataplaneId: "dp1", DryRun: true}); d.GetWorker() != "http://d.test:8000" || d.GetWorkerSource() != "dns" {
		t.Errorf("route answer %v: want the discovered worker with source dns", d)
	}
}
