package main

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go"
	anthropicopt "github.com/anthropics/anthropic-sdk-go/option"
	"github.com/openai/openai-go/v3"
	openaiopt "github.com/openai/openai-go/v3/option"
	"go.uber.org/goleak"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/dataplane/server"
	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/internal/testkit/proc"
	"github.com/cartrouter/cart/sim"
	"github.com/cartrouter/cart/sim/simtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, append(testkit.IdleHTTPConns(), testkit.IgnoreZMQPubWriter, // features_test.go's publishers
		goleak.Cleanup(proc.Exit))...) // removes the cart binary sighup_test.go builds
}

// startAllInOne runs the real all-in-one server (config → NewAllInOne →
// Run on a TCP listener) in front of n cart-sim replicas.
func startAllInOne(t *testing.T, n int, mutate func(*config.Config)) (string, []*httptest.Server) {
	t.Helper()
	sims := make([]sim.Config, n)
	for i := range sims {
		sims[i] = sim.Config{Name: "sim-" + string(rune('a'+i)), BlockTokens: 16, OutputTokens: 8}
	}
	return startWithSims(t, sims, mutate)
}

func startWithSims(t *testing.T, sims []sim.Config, mutate func(*config.Config)) (string, []*httptest.Server) {
	t.Helper()
	var reps []*httptest.Server
	cfg := config.Default()
	for _, sc := range sims {
		if len(sc.Models) == 0 {
			// CART routes a model only to replicas listing it in
			// /v1/models; the names these tests send.
			sc.Models = []string{"sim", "claude-sim"}
		}
		r := simtest.Start(t, sc)
		reps = append(reps, r.HTTP)
		cfg.Workers = append(cfg.Workers, config.Worker{URL: r.URL})
	}
	cfg.Server.Host, cfg.Server.MinOpenFiles = "127.0.0.1", 0 // the test listens on its own port
	cfg.Proxy.AddRoutedPeerHeader = true
	cfg.Health.IntervalSecs, cfg.Health.TimeoutSecs = 1, 0.5
	if mutate != nil {
		mutate(cfg)
	}
	if err := cfg.Validate(config.RoleAllInOne); err != nil {
		t.Fatal(err)
	}
	a, err := server.NewAllInOne(cfg, nil, slog.New(slog.NewTextHandler(io.Discard, nil)), 7)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	})
	return "http://" + ln.Addr().String(), reps
}

func TestOpenAISDKThroughCART(t *testing.T) {
	base, _ := startAllInOne(t, 3, nil)
	client := openai.NewClient(openaiopt.WithBaseURL(base+"/v1/"), openaiopt.WithAPIKey("sk-test"), openaiopt.WithMaxRetries(0))
	system := strings.Repeat("You are the CART test assistant; answer in one line. ", 40)
	ctx := context.Background()
	var peers []string
	for i, q := range []string{"What is a prefix cache?", "Why route by prefix?", "What is TTFT?"} {
		params := openai.ChatCompletionNewParams{
			Model:    "sim",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(system), openai.UserMessage(q)},
		}
		var raw *http.Response
		resp, err := client.Chat.Completions.New(ctx, params, openaiopt.WithResponseInto(&raw))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if resp.Choices[0].Message.Content == "" || resp.Usage.PromptTokens == 0 {
			t.Fatalf("response %+v", resp)
		}
		if i > 0 && resp.Usage.PromptTokensDetails.CachedTokens == 0 {
			t.Fatalf("request %d: the shared system prompt was not cached (routed to %s after %v)", i, raw.Header.Get("X-Routed-Peer"), peers)
		}
		peers = append(peers, raw.Header.Get("X-Routed-Peer"))
	}
	if peers[0] == "" || peers[1] != peers[0] || peers[2] != peers[0] {
		t.Fatalf("same-prefix requests spread over replicas: %v", peers)
	}

	// Streaming: chunks arrive and accumulate into the same kind of answer,
	// usage included.
	params := openai.ChatCompletionNewParams{
		Model:         "sim",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(system), openai.UserMessage("Stream please")},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	chunks := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	_ = stream.Close()
	if chunks < 3 || acc.Choices[0].Message.Content == "" {
		t.Fatalf("stream: %d chunks, content %q", chunks, acc.Choices[0].Message.Content)
	}
	if acc.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Fatalf("streamed request missed the cache: usage %+v", acc.Usage)
	}
}

func TestAnthropicSDKThroughCART(t *testing.T) {
	base, _ := startAllInOne(t, 2, nil)
	client := anthropic.NewClient(anthropicopt.WithoutEnvironmentDefaults(), anthropicopt.WithBaseURL(base),
		anthropicopt.WithAPIKey("test"), anthropicopt.WithMaxRetries(0))
	params := anthropic.MessageNewParams{
		Model:     "claude-sim",
		MaxTokens: 8,
		System:    []anthropic.TextBlockParam{{Text: strings.Repeat("You are terse and precise. ", 40)}},
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say something."))},
	}
	ctx := context.Background()
	msg, err := client.Messages.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(msg.Content) != 1 || msg.Content[0].Text == "" {
		t.Fatalf("message %+v", msg)
	}
	stream := client.Messages.NewStreaming(ctx, params)
	var acc anthropic.Message
	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	_ = stream.Close()
	if acc.Content[0].Text == "" {
		t.Fatal("empty streamed message")
	}
	// The second identical request went where the first did: its system
	// prompt was read from the replica's cache.
	if acc.Usage.CacheReadInputTokens == 0 {
		t.Fatalf("streamed message missed the cache: usage %+v", acc.Usage)
	}
}

// The first SSE event must reach the client while the replica is still
// generating: nothing in the path buffers the stream.
func TestStreamFirstByteBeforeReplicaFinishes(t *testing.T) {
	sc := sim.Config{Name: "slow", BlockTokens: 16, DecodeMsPerToken: 5, TimeScale: 1}
	base, _ := startWithSims(t, []sim.Config{sc}, nil)
	// 200 tokens at 5 ms each: the replica needs about a second to finish.
	body := `{"model":"sim","stream":true,"max_tokens":200,"messages":[{"role":"user","content":"long answer please"}]}`
	start := time.Now()
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q: %v", line, err)
	}
	first := time.Since(start)
	_, _ = io.Copy(io.Discard, resp.Body)
	total := time.Since(start)
	if total < 900*time.Millisecond {
		t.Fatalf("replica finished in %v; the test needs a slow replica", total)
	}
	if first > total/3 {
		t.Fatalf("first event after %v of %v: the stream was buffered", first, total)
	}
}
