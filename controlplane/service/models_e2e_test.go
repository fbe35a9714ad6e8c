package service

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cartrouter/cart/controlplane/models"
	"github.com/cartrouter/cart/dataplane/apierr"
	"github.com/cartrouter/cart/dataplane/remote"
	"github.com/cartrouter/cart/dataplane/router"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/sim"
	"github.com/cartrouter/cart/sim/simtest"
)

// The leader's prober learns each worker's models, including a LoRA
// adapter loaded at run time; data planes receive the lists with the
// worker set and route only among workers serving the model, and the
// leader itself refuses a model no worker serves (NOT_FOUND, which the
// data plane turns into 404 model_not_found) even before the data plane's
// next sync.
func TestLeaderLearnsModelsAndDataPlaneFilters(t *testing.T) {
	names := []string{"a", "b", "c"}
	urls := simtest.URLs(t, len(names), func(i int) sim.Config { return sim.Config{Name: names[i], Models: []string{"base"}} })
	cp := newTestCP(t, cpConfig{leader: true, opts: func(o *Options) {
		o.HealthClient = nil // probe the sims for real
		o.Health.Interval, o.Health.Timeout = 20*time.Millisecond, 2*time.Second
	}})
	cp.addWorkers(t, urls...)
	client := testkit.H2CClient()
	t.Cleanup(client.CloseIdleConnections)
	reg := models.New()
	dp := remote.New(remote.Options{
		ID: "dp1", ControlPlanes: []string{cp.url}, RouteTimeout: 5 * time.Second,
		SyncInterval: time.Hour, FlushInterval: 5 * time.Millisecond, HTTPClient: client,
		BlockChars: testBlockChars, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Models: reg,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); dp.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	post := func(url, body string) {
		resp, err := http.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST %s: %d", url, resp.StatusCode)
		}
	}
	post(urls[2]+"/v1/load_lora_adapter", `{"lora_name":"lora","lora_path":"/a"}`)
	testkit.WaitFor(t, 5*time.Second, "the data plane to learn the adapter", func() bool {
		if err := dp.SyncOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		return slices.Contains(reg.IDs(urls[2]), "lora") && slices.Equal(reg.IDs(urls[0]), []string{"base"})
	})
	for i := range 10 {
		ex, err := reg.Exclude("lora")
		if err != nil {
			t.Fatal(err)
		}
		txt := text(200, i)
		d, err := dp.Decide(context.Background(), &router.Request{Model: "lora", Hashes: hashes("lora", txt), KeyLen: len(txt), Exclude: ex})
		if err != nil || d.Worker != urls[2] || !d.FromLeader {
			t.Fatalf("route %d for the adapter: %+v, %v (adapter on %s)", i, d, err, urls[2])
		}
		dp.Done(d, router.Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1})
	}
	// The leader filters on its own too: a Route naming the adapter and no
	// exclusions still lands on the adapter's worker.
	for i := range 5 {
		resp := route(t, cp.router(), &cartv1.RouteRequest{Model: "lora", Text: text(100, 100+i), DryRun: true})
		if resp.GetWorker() != urls[2] {
			t.Fatalf("leader routed the adapter to %s", resp.GetWorker())
		}
	}

	post(urls[2]+"/v1/unload_lora_adapter", `{"lora_name":"lora"}`)
	// The data plane has not synced since; the leader's refusal reaches
	// the client as a 404 anyway.
	testkit.WaitFor(t, 5*time.Second, "the leader to refuse the unloaded adapter", func() bool {
		_, err := dp.Decide(context.Background(), &router.Request{Model: "lora", DryRun: true})
		var ae *apierr.Error
		return errors.As(err, &ae) && ae.Status == http.StatusNotFound && ae.Code == "model_not_found"
	})
	_, err := cp.router().Route(context.Background(), connect.NewRequest(&cartv1.RouteRequest{Model: "nope", Text: "x", DryRun: true}))
	wantCode(t, err, connect.CodeNotFound)
}

// Models declared in the leader's config (workers[].models) count without
// any usable /v1/models answer and reach data planes through Sync.
func TestLeaderDeclaredModels(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true, opts: func(o *Options) {
		o.DeclaredModels = map[string][]string{w2: {"decl"}} // okTransport's "ok" is no model list
	}})
	cp.addWorkers(t, w1, w2)
	testkit.WaitFor(t, 5*time.Second, "the declared model in Sync", func() bool {
		for _, w := range syncLoads(t, cp.router(), "dp1", nil).GetWorkers() {
			if w.GetUrl() == w2 && slices.Equal(w.GetModels(), []string{"decl"}) {
				return true
			}
		}
		return false
	})
	for i := range 6 {
		if resp := route(t, cp.router(), &cartv1.RouteRequest{Model: "decl", Text: text(100, i), DryRun: true}); resp.GetWorker() != w2 {
			t.Fatalf("declared model routed to %s", resp.GetWorker())
		}
	}
	_, err := cp.router().Route(context.Background(), connect.NewRequest(&cartv1.RouteRequest{Model: "other", Text: "x", DryRun: true}))
	if connect.CodeOf(err) == connect.CodeNotFound {
		t.Fatal("a model maybe served by a worker with an unknown list was refused")
	}
}

// A worker added between probe rounds has its models read at once: until
// then an adapter it holds would be routed as if nobody served it there.
func TestLeaderReadsAddedWorkersModelsAtOnce(t *testing.T) {
	urls := simtest.URLs(t, 2, func(i int) sim.Config {
		sc := sim.Config{Name: []string{"a", "b"}[i], Models: []string{"base"}}
		if i == 1 {
			sc.LoRAModules = []sim.LoRAModule{{Name: "lora", Path: "/adapters/lora"}}
		}
		return sc
	})
	cp := newTestCP(t, cpConfig{leader: true, opts: func(o *Options) {
		o.HealthClient = nil                                           // probe the sims for real
		o.Health.Interval, o.Health.Timeout = time.Hour, 2*time.Second // no second round during the test
	}})
	cp.addWorkers(t, urls[0])
	modelsOf := func(url string) []string {
		list, err := cp.admin().ListWorkers(context.Background(), connect.NewRequest(&cartv1.ListWorkersRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range list.Msg.GetWorkers() {
			if w.GetUrl() == url {
				return w.GetModels()
			}
		}
		return nil
	}
	testkit.WaitFor(t, 5*time.Second, "the first worker's models (first round)", func() bool { return len(modelsOf(urls[0])) > 0 })
	cp.addWorkers(t, urls[1])
	testkit.WaitFor(t, 5*time.Second, "the added worker's adapter, an hour before the next round", func() bool {
		return slices.Contains(modelsOf(urls[1]), "lora")
	})
}
