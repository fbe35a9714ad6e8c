package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	openaiopt "github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/cartrouter/cart/dataplane/breaker"
	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/dataplane/remote"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/sim"
	"github.com/cartrouter/cart/sim/simtest"
)

// TestResponsesChainAcrossDataPlanes: a previous_response_id chain sent
// through two data planes in turn, with the official SDK, stays on the
// cart-sim replica holding the conversation (a replica 404s ids it did not
// make), although each turn's input is a prompt the shared prefix index
// placed on another replica. A data plane learns the id of an answer
// another data plane delivered only through the leader.
func TestResponsesChainAcrossDataPlanes(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true})
	urls := simtest.URLs(t, 3, func(i int) sim.Config { return sim.Config{Name: fmt.Sprint("r", i), OutputTokens: 4, TimeScale: 0.01} })
	cp.addWorkers(t, urls...)

	ctx, cancel := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var fronts []string
	var clients []*openai.Client
	var closers []func()
	for i := range 2 {
		rpc := testkit.H2CClient()
		dp := remote.New(remote.Options{
			ID: fmt.Sprint("dp", i), ControlPlanes: []string{cp.url}, RouteTimeout: 2 * time.Second,
			SyncInterval: 50 * time.Millisecond, FlushInterval: 5 * time.Millisecond, HTTPClient: rpc,
			BlockChars: testBlockChars, Logger: quiet,
		})
		testkit.WaitFor(t, 5*time.Second, "data plane sees three healthy workers", func() bool {
			if dp.SyncOnce(context.Background()) != nil {
				return false
			}
			n := 0
			for _, w := range dp.Workers() {
				if w.Healthy {
					n++
				}
			}
			return n == 3
		})
		bg.Add(1)
		go func() { defer bg.Done(); dp.Run(ctx) }()
		upstream := proxy.NewTransport(time.Second, 10*time.Second)
		p := proxy.New(proxy.Options{
			Router: dp, Breakers: breaker.NewSet(breaker.Config{}, nil), Logger: quiet,
			BlockChars: testBlockChars, MaxBodyBytes: 1 << 20, RequestTimeout: 10 * time.Second,
			MaxRetries: 1, BackoffMultiplier: 2, RetryBudgetRatio: 0.2, RetryBudgetMin: 3,
			Transport: upstream,
		})
		front := httptest.NewServer(p)
		sdkTransport := &http.Transport{}
		c := openai.NewClient(openaiopt.WithBaseURL(front.URL+"/v1/"), openaiopt.WithAPIKey("sk-test"),
			openaiopt.WithMaxRetries(0), openaiopt.WithHTTPClient(&http.Client{Transport: sdkTransport}))
		fronts = append(fronts, front.URL)
		clients = append(clients, &c)
		closers = append(closers, func() {
			front.Close()
			sdkTransport.CloseIdleConnections()
			upstream.CloseIdleConnections()
			rpc.CloseIdleConnections()
		})
	}
	t.Cleanup(func() {
		cancel()
		bg.Wait()
		for _, f := range closers {
			f()
		}
	})

	replicaOf := func(raw *http.Response) string { return raw.Header.Get("X-Sim-Replica") }
	var raw *http.Response
	first, err := clients[0].Responses.New(ctx, responses.ResponseNewParams{
		Model: "sim", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Start a conversation.")},
	}, openaiopt.WithResponseInto(&raw))
	if err != nil {
		t.Fatal(err)
	}
	owner := replicaOf(raw)

	prev := first.ID
	for turn := range 3 {
		// A prompt the shared index holds on another replica.
		var decoy string
		for i := 0; decoy == ""; i++ {
			if i == 20 {
				t.Fatal("every decoy landed on the chain's replica")
			}
			p := strings.Repeat(fmt.Sprintf("decoy %d.%d, a long unrelated prompt. ", turn, i), 20)
			if _, err := clients[0].Responses.New(ctx, responses.ResponseNewParams{
				Model: "sim", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(p)},
			}, openaiopt.WithResponseInto(&raw)); err != nil {
				t.Fatal(err)
			}
			if replicaOf(raw) != owner {
				decoy = p
			}
		}
		dp := (turn + 1) % 2 // turn 0 through the other data plane
		params := responses.ResponseNewParams{
			Model: "sim", PreviousResponseID: openai.String(prev),
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(decoy)},
		}
		if turn == 1 {
			stream := clients[dp].Responses.NewStreaming(ctx, params, openaiopt.WithResponseInto(&raw))
			var done responses.Response
			for stream.Next() {
				if ev := stream.Current(); ev.Type == "response.completed" {
					done = ev.Response
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("turn %d via %s: %v", turn, fronts[dp], err)
			}
			_ = stream.Close()
			prev = done.ID
		} else {
			r, err := clients[dp].Responses.New(ctx, params, openaiopt.WithResponseInto(&raw))
			if err != nil {
				t.Fatalf("turn %d via %s: %v", turn, fronts[dp], err)
			}
			prev = r.ID
		}
		if got := replicaOf(raw); got != owner || prev == "" {
			t.Fatalf("turn %d via data plane %d went to %s (id %q), want %s", turn, dp, got, prev, owner)
		}
	}

	// The replica leaves the pool: data plane 0, which never saw the last
	// answer, learns from the leader that the response is gone.
	var ownerURL string
	for i, u := range urls {
		if owner == fmt.Sprint("r", i) {
			ownerURL = u
		}
	}
	cmd := &cartv1.RaftCommand{Body: &cartv1.RaftCommand_RemoveWorker{RemoveWorker: &cartv1.RemoveWorkerCommand{Url: ownerURL}}}
	if _, err := cp.node.Apply(ctx, cmd); err != nil {
		t.Fatal(err)
	}
	_, err = clients[0].Responses.New(ctx, responses.ResponseNewParams{
		Model: "sim", PreviousResponseID: openai.String(prev),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("one more")},
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "previous_response_not_found" {
		t.Fatalf("continuation of a response on a removed replica: %v", err)
	}
}
