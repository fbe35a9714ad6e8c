package bench

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/sim"
)

// Result is what one streamed chat completion returned.
type Result struct {
	Status           int
	Err              error
	TTFT, E2E        time.Duration
	Replica          string
	PromptTokens     int
	CachedTokens     int
	CompletionTokens int
	UsageFrom        string
	// Content is the generated text (kept only when asked for: multiturn).
	Content string
}

// Sender sends one chat request. The real one streams through openai-go;
// tests substitute fakes.
type Sender interface {
	Send(ctx context.Context, msgs []Message, maxTokens int, keepContent bool) Result
}

// NewHTTPClient returns the load generator's HTTP client: keep-alive pool as
// large as the concurrency cap, no environment proxy, no compression.
func NewHTTPClient(maxConns int) *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         d.DialContext,
		MaxIdleConns:        max(maxConns, 16),
		MaxIdleConnsPerHost: max(maxConns, 16),
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}}
}

// OpenAISender streams chat completions with the official openai-go client,
// asking for usage in the final chunk.
type OpenAISender struct {
	client openai.Client
	model  string
}

// NewOpenAISender targets baseURL (e.g. http://127.0.0.1:6700; "/v1" is
// appended unless present). The client never retries: a failed request is a
// result.
func NewOpenAISender(baseURL, model string, hc *http.Client, opts ...option.RequestOption) *OpenAISender {
	base := strings.TrimRight(baseURL, "/")
	if !strings.HasSuffix(base, "/v1") {
		base += "/v1"
	}
	return &OpenAISender{
		client: openai.NewClient(append([]option.RequestOption{
			option.WithBaseURL(base + "/"),
			option.WithAPIKey("cart-bench"),
			option.WithHTTPClient(hc),
			option.WithMaxRetries(0),
		}, opts...)...),
		model: model,
	}
}

// Send implements Sender.
func (s *OpenAISender) Send(ctx context.Context, msgs []Message, maxTokens int, keepContent bool) Result {
	params := openai.ChatCompletionNewParams{
		Model:         s.model,
		Messages:      make([]openai.ChatCompletionMessageParamUnion, 0, len(msgs)),
		MaxTokens:     openai.Int(int64(maxTokens)),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	}
	for _, m := range msgs {
		switch m.Role {
		case "system":
			params.Messages = append(params.Messages, openai.SystemMessage(m.Content))
		case "assistant":
			params.Messages = append(params.Messages, openai.AssistantMessage(m.Content))
		default:
			params.Messages = append(params.Messages, openai.UserMessage(m.Content))
		}
	}
	var res Result
	var resp *http.Response
	start := time.Now()
	stream := s.client.Chat.Completions.NewStreaming(ctx, params, option.WithResponseInto(&resp))
	defer func() { _ = stream.Close() }()
	var content strings.Builder
	var first time.Duration
	gotUsage := false
	for stream.Next() {
		ch := stream.Current()
		if first == 0 {
			for _, c := range ch.Choices {
				if c.Delta.Content != "" {
					first = time.Since(start)
					break
				}
			}
		}
		if keepContent {
			for _, c := range ch.Choices {
				content.WriteString(c.Delta.Content)
			}
		}
		if ch.JSON.Usage.Valid() && (ch.Usage.PromptTokens > 0 || ch.Usage.CompletionTokens > 0) {
			gotUsage = true
			res.PromptTokens = int(ch.Usage.PromptTokens)
			res.CachedTokens = int(ch.Usage.PromptTokensDetails.CachedTokens)
			res.CompletionTokens = int(ch.Usage.CompletionTokens)
		}
	}
	res.E2E = time.Since(start)
	res.TTFT = first
	res.Err = stream.Err()
	if resp != nil {
		res.Status = resp.StatusCode
		res.Replica = resp.Header.Get(sim.HeaderReplica)
		if res.Replica == "" {
			res.Replica = resp.Header.Get(proxy.HeaderRoutedPeer)
		}
	}
	var apiErr *openai.Error
	if errors.As(res.Err, &apiErr) {
		res.Status = apiErr.StatusCode
	}
	if res.Err == nil && res.TTFT == 0 {
		res.TTFT = res.E2E // no content chunk at all: count the whole wait
	}
	if gotUsage {
		res.UsageFrom = "usage"
	} else if resp != nil {
		p, perr := strconv.Atoi(resp.Header.Get(sim.HeaderPromptTokens))
		c, cerr := strconv.Atoi(resp.Header.Get(sim.HeaderCachedTokens))
		if perr == nil && cerr == nil {
			res.PromptTokens, res.CachedTokens, res.UsageFrom = p, c, "headers"
		}
	}
	if keepContent {
		res.Content = content.String()
	}
	return res
}
