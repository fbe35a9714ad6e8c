package sim

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go"
	anthropicopt "github.com/anthropics/anthropic-sdk-go/option"
	"github.com/openai/openai-go/v3"
	openaiopt "github.com/openai/openai-go/v3/option"
)

type chunk struct {
	Object  string `json:"object"`
	Choices []struct {
		Delta struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *openAIUsage `json:"usage"`
}

func decodeChunk(t *testing.T, ev sseEvent) chunk {
	t.Helper()
	var c chunk
	if err := json.Unmarshal([]byte(ev.data), &c); err != nil {
		t.Fatalf("chunk %q: %v", ev.data, err)
	}
	return c
}

func openStream(t *testing.T, ctx context.Context, ts *httptest.Server, url string, body any) (*http.Response, *sseReader) {
	t.Helper()
	raw, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type = %q", ct)
	}
	return resp, newSSEReader(resp.Body)
}

func TestChatStreamArrivesIncrementally(t *testing.T) {
	// 10 tokens at 100 ms each: the first token is out after ~0.1 s while
	// the stream still has most of a second to go.
	s, ts := startReplica(t, Config{DecodeMsPerToken: 100, OutputTokens: 10, TimeScale: 1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, sr := openStream(t, ctx, ts, ts.URL+pathChat, chatBody("stream please", "stream", true))

	// Headers come before any token and already carry the cache outcome.
	if resp.Header.Get("X-Sim-Prompt-Tokens") == "" || resp.Header.Get("X-Sim-Cached-Tokens") != "0" {
		t.Fatalf("X-Sim headers missing from a stream: %v", resp.Header)
	}
	role, err := sr.next()
	if err != nil {
		t.Fatal(err)
	}
	if c := decodeChunk(t, role); c.Choices[0].Delta.Role != "assistant" {
		t.Fatalf("first chunk %s does not announce the assistant role", role.data)
	}
	first, err := sr.next()
	if err != nil {
		t.Fatal(err)
	}
	if c := decodeChunk(t, first); c.Choices[0].Delta.Content == nil || *c.Choices[0].Delta.Content == "" {
		t.Fatalf("second chunk %s carries no token", first.data)
	}
	// The handler is still decoding: the client saw the first token before
	// the response was complete.
	if got := s.Stats().Running; got != 1 {
		t.Fatalf("running = %d after the first token, want 1 (stream already finished?)", got)
	}
}

func TestChatStreamIncludeUsage(t *testing.T) {
	_, ts := startReplica(t, Config{})
	body := chatBody(strings.Repeat("usage in streams ", 20), "stream", true,
		"stream_options", map[string]any{"include_usage": true}, "max_tokens", 7)
	complete(t, ts, pathChat, chatBody(strings.Repeat("usage in streams ", 20))) // warm the cache

	_, sr := openStream(t, context.Background(), ts, ts.URL+pathChat, body)
	events, err := sr.readAll()
	if err != io.EOF {
		t.Fatalf("stream ended with %v", err)
	}
	// role, 7 tokens, finish, usage, [DONE]
	if len(events) != 11 {
		t.Fatalf("got %d events, want 11: %v", len(events), events)
	}
	if events[10].data != "[DONE]" {
		t.Fatalf("last event %q, want [DONE]", events[10].data)
	}
	var text strings.Builder
	for _, ev := range events[1:8] {
		c := decodeChunk(t, ev)
		if c.Object != "chat.completion.chunk" || c.Usage != nil {
			t.Fatalf("token chunk %s", ev.data)
		}
		text.WriteString(*c.Choices[0].Delta.Content)
	}
	finish := decodeChunk(t, events[8])
	if r := finish.Choices[0].FinishReason; r == nil || *r != "length" {
		t.Fatalf("finish chunk %s, want finish_reason length", events[8].data)
	}
	u := decodeChunk(t, events[9])
	if len(u.Choices) != 0 || u.Usage == nil {
		t.Fatalf("usage chunk %s, want empty choices and usage", events[9].data)
	}
	if u.Usage.CompletionTokens != 7 || u.Usage.TotalTokens != u.Usage.PromptTokens+7 {
		t.Fatalf("usage %+v", *u.Usage)
	}
	if u.Usage.PromptTokensDetails.CachedTokens != u.Usage.PromptTokens/16*16 {
		t.Fatalf("stream usage cached %d of %d tokens after warm-up", u.Usage.PromptTokensDetails.CachedTokens, u.Usage.PromptTokens)
	}
	// The streamed text is the same text a non-streamed request gets.
	full := complete(t, ts, pathChat, chatBody(strings.Repeat("usage in streams ", 20), "max_tokens", 7))
	if got := full.Choices[0].Message.Content; got != text.String() {
		t.Fatalf("streamed %q, non-streamed %q", text.String(), got)
	}
}

func TestChatStreamWithoutIncludeUsageHasNoUsageChunk(t *testing.T) {
	_, ts := startReplica(t, Config{OutputTokens: 3})
	_, sr := openStream(t, context.Background(), ts, ts.URL+pathChat, chatBody("hi", "stream", true))
	events, _ := sr.readAll()
	for _, ev := range events[:len(events)-1] {
		if c := decodeChunk(t, ev); c.Usage != nil {
			t.Fatalf("unexpected usage in %s", ev.data)
		}
	}
	if c := decodeChunk(t, events[len(events)-2]); *c.Choices[0].FinishReason != "stop" {
		t.Fatalf("finish_reason %v, want stop when the replica chose the length", *c.Choices[0].FinishReason)
	}
}

func TestCompletionsStream(t *testing.T) {
	_, ts := startReplica(t, Config{})
	body := map[string]any{"prompt": "Once upon a time", "max_tokens": 4, "stream": true,
		"stream_options": map[string]any{"include_usage": true}}
	_, sr := openStream(t, context.Background(), ts, ts.URL+pathCompletions, body)
	events, err := sr.readAll()
	if err != io.EOF || len(events) != 7 { // 4 tokens, finish, usage, [DONE]
		t.Fatalf("got %d events (%v): %v", len(events), err, events)
	}
	for _, ev := range events[:4] {
		if c := decodeChunk(t, ev); c.Object != "text_completion" || c.Choices[0].Text == "" {
			t.Fatalf("token chunk %s", ev.data)
		}
	}
	if u := decodeChunk(t, events[5]); u.Usage == nil || u.Usage.PromptTokens != 4 || u.Usage.CompletionTokens != 4 {
		t.Fatalf("usage chunk %s", events[5].data)
	}
}

func TestAnthropicStreamEventSequence(t *testing.T) {
	_, ts := startReplica(t, Config{})
	body := map[string]any{
		"model": "claude-test", "max_tokens": 3, "stream": true,
		"system":   "Be brief.",
		"messages": []map[string]any{{"role": "user", "content": "Hello"}},
	}
	_, sr := openStream(t, context.Background(), ts, ts.URL+pathMessages, body)
	events, err := sr.readAll()
	if err != io.EOF {
		t.Fatal(err)
	}
	var names []string
	for _, ev := range events {
		names = append(names, ev.name)
		var typed struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal([]byte(ev.data), &typed); err != nil || typed.Type != ev.name {
			t.Fatalf("event %s has data type %q (%v)", ev.name, typed.Type, err)
		}
	}
	want := []string{"message_start", "content_block_start",
		"content_block_delta", "content_block_delta", "content_block_delta",
		"content_block_stop", "message_delta", "message_stop"}
	if !slices.Equal(names, want) {
		t.Fatalf("events %v, want %v", names, want)
	}
}

func TestAnthropicSDKParsesResponses(t *testing.T) {
	_, ts := startReplica(t, Config{})
	client := anthropic.NewClient(
		anthropicopt.WithoutEnvironmentDefaults(),
		anthropicopt.WithBaseURL(ts.URL),
		anthropicopt.WithAPIKey("test"),
		anthropicopt.WithHTTPClient(ts.Client()),
		anthropicopt.WithMaxRetries(0),
	)
	params := anthropic.MessageNewParams{
		Model:     "claude-test",
		MaxTokens: 12,
		System:    []anthropic.TextBlockParam{{Text: strings.Repeat("You are terse. ", 20)}},
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say something."))},
	}
	ctx := context.Background()

	msg, err := client.Messages.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Role != "assistant" || len(msg.Content) != 1 || msg.Content[0].Type != "text" || msg.Content[0].Text == "" {
		t.Fatalf("message %+v", msg)
	}
	if msg.StopReason != anthropic.StopReasonMaxTokens || msg.Usage.OutputTokens != 12 || msg.Usage.CacheReadInputTokens != 0 {
		t.Fatalf("stop %q usage %+v", msg.StopReason, msg.Usage)
	}
	promptTokens := msg.Usage.InputTokens

	stream := client.Messages.NewStreaming(ctx, params)
	defer stream.Close()
	var acc anthropic.Message
	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if acc.Content[0].Text != msg.Content[0].Text {
		t.Fatalf("streamed %q, non-streamed %q", acc.Content[0].Text, msg.Content[0].Text)
	}
	// The second request hits the cache: input_tokens counts only the
	// uncached remainder, as Anthropic's usage does.
	u := acc.Usage
	if u.CacheReadInputTokens == 0 || u.InputTokens+u.CacheReadInputTokens != promptTokens || u.OutputTokens != 12 {
		t.Fatalf("streamed usage %+v; first request had %d input tokens", u, promptTokens)
	}
	if acc.StopReason != anthropic.StopReasonMaxTokens {
		t.Fatalf("stop reason %q", acc.StopReason)
	}
}

func TestOpenAISDKParsesResponses(t *testing.T) {
	_, ts := startReplica(t, Config{})
	client := openai.NewClient(
		openaiopt.WithBaseURL(ts.URL+"/v1/"),
		openaiopt.WithAPIKey("test"),
		openaiopt.WithHTTPClient(ts.Client()),
		openaiopt.WithMaxRetries(0),
	)
	params := openai.ChatCompletionNewParams{
		Model: "test-model",
		Messages: []openai.ChatCompletionMessageParamUnion{
			openai.SystemMessage(strings.Repeat("Answer briefly. ", 20)),
			openai.UserMessage("What is CART?"),
		},
		MaxCompletionTokens: openai.Int(5),
	}
	ctx := context.Background()

	resp, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Choices[0].FinishReason != "length" || resp.Usage.CompletionTokens != 5 || resp.Choices[0].Message.Content == "" {
		t.Fatalf("response %+v", resp)
	}

	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	defer stream.Close()
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if got := acc.Choices[0].Message.Content; got != resp.Choices[0].Message.Content {
		t.Fatalf("streamed %q, non-streamed %q", got, resp.Choices[0].Message.Content)
	}
	if acc.Usage.PromptTokensDetails.CachedTokens == 0 || acc.Usage.PromptTokens != resp.Usage.PromptTokens {
		t.Fatalf("streamed usage %+v", acc.Usage)
	}
}
