package service

import (
	"context"
	"testing"

	"connectrpc.com/connect"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// The leader's split decision over the RPC: one answer with both legs and
// a ticket each, the placement replicated for the prefill worker, the
// load of each leg released by its own completion, a dry run naming both
// and taking nothing; the worker set lists the roles.
func TestRouteSplitPair(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true})
	for url, role := range map[string]string{w1: "prefill", w2: "decode"} {
		src := map[string]string{w1: "dns", w2: "admin"}[url]
		cmd := &cartv1.RaftCommand{Body: &cartv1.RaftCommand_UpsertWorker{UpsertWorker: &cartv1.UpsertWorkerCommand{Worker: &cartv1.WorkerSpec{Url: url, Role: role, Source: src}}}}
		if _, err := cp.node.Apply(context.Background(), cmd); err != nil {
			t.Fatal(err)
		}
	}
	rc := cp.router()
	txt := text(200, 9)
	req := &cartv1.RouteRequest{Model: "m", BlockHashes: hashes("m", txt), KeyLength: 200, DataplaneId: "dp1",
		Disaggregation: cartv1.Disaggregation_DISAGGREGATION_PAIR, DryRun: true}
	dry := route(t, rc, req)
	if dry.GetReason() != "pd" || dry.GetWorker() != w2 || dry.GetPrefill().GetWorker() != w1 || dry.GetPrefill().GetTicket() != 0 {
		t.Fatalf("dry run %v", dry)
	}
	if l := cp.loads(t); l[w1]+l[w2] != 0 {
		t.Fatalf("a dry run took load: %v", l)
	}
	req.DryRun = false
	d := route(t, rc, req)
	p := d.GetPrefill()
	if d.GetReason() != "pd" || d.GetWorker() != w2 || p.GetWorker() != w1 || p.GetTicket() == 0 || d.GetTicket() == 0 || p.GetReason() != "cache_miss" {
		t.Fatalf("split %v", d)
	}
	if p.GetWorkerSource() != "dns" || d.GetWorkerSource() != "admin" {
		t.Fatalf("sources: prefill %q, decode %q (the worker key goes by them)", p.GetWorkerSource(), d.GetWorkerSource())
	}
	if l := cp.loads(t); l[w1] != 1 || l[w2] != 1 {
		t.Fatalf("loads %v", l)
	}
	again := route(t, rc, req)
	if again.GetPrefill().GetReason() != "cache_hit" || again.GetPrefill().GetWorker() != w1 {
		t.Fatalf("the prompt was not placed on the prefill worker: %v", again)
	}
	// Whole when asked whole: to the decode worker, the only one that may
	// take a whole request in a pool without both workers.
	whole := route(t, rc, &cartv1.RouteRequest{Model: "m", Text: "whole", DataplaneId: "dp1"})
	if whole.GetWorker() != w2 || whole.GetPrefill() != nil {
		t.Fatalf("whole %v", whole)
	}
	n := complete(t, rc, "dp1",
		&cartv1.Completion{Ticket: p.GetTicket(), Worker: w1, Delivered: true},
		&cartv1.Completion{Ticket: d.GetTicket(), Worker: w2, Delivered: true},
		&cartv1.Completion{Ticket: again.GetPrefill().GetTicket(), Worker: w1, Delivered: true},
		&cartv1.Completion{Ticket: again.GetTicket(), Worker: w2, Delivered: true},
		&cartv1.Completion{Ticket: whole.GetTicket(), Worker: w2, Delivered: true})
	if n != 5 {
		t.Fatalf("settled %d of 5", n)
	}
	if l := cp.loads(t); l[w1]+l[w2] != 0 {
		t.Fatalf("loads after every leg %v", l)
	}
	resp, err := cp.admin().ListWorkers(context.Background(), connect.NewRequest(&cartv1.ListWorkersRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range resp.Msg.GetWorkers() {
		if want := map[string]string{w1: "prefill", w2: "decode"}[w.GetUrl()]; w.GetRole() != want {
			t.Errorf("%s listed with role %q, want %q", w.GetUrl(), w.GetRole(), want)
		}
	}
}
