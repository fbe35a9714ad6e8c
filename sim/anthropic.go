package sim

import (
	"context"
	"encoding/json"
	"net/http"
)

// Anthropic Messages API wire types.

type messagesRequest struct {
	kvField
	Model     string             `json:"model"`
	System    json.RawMessage    `json:"system"`
	Messages  []anthropicMessage `json:"messages"`
	Tools     json.RawMessage    `json:"tools"`
	MaxTokens *int               `json:"max_tokens"`
	Stream    bool               `json:"stream"`
}

type anthropicUsage struct {
	// InputTokens excludes cached tokens, as in Anthropic's API, where the
	// prompt size is input + cache read + cache creation tokens.
	// Under Config.NoCacheDetails the cache fields are left out and
	// InputTokens is the whole prompt, which is what vLLM's /v1/messages
	// always answers.
	InputTokens              int  `json:"input_tokens"`
	CacheCreationInputTokens *int `json:"cache_creation_input_tokens,omitempty"`
	CacheReadInputTokens     *int `json:"cache_read_input_tokens,omitempty"`
	OutputTokens             int  `json:"output_tokens"`
}

func (s *Server) anthropicUsageOf(j *job, output int) anthropicUsage {
	if s.cfg.NoCacheDetails {
		return anthropicUsage{InputTokens: j.promptTokens, OutputTokens: output}
	}
	zero, cached := 0, j.cachedTokens
	return anthropicUsage{
		InputTokens:              j.promptTokens - j.cachedTokens,
		CacheCreationInputTokens: &zero,
		CacheReadInputTokens:     &cached,
		OutputTokens:             output,
	}
}

type anthropicText struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type anthropicResponse struct {
	ID           string          `json:"id"`
	Type         string          `json:"type"`
	Role         string          `json:"role"`
	Model        string          `json:"model"`
	Content      []anthropicText `json:"content"`
	StopReason   *string         `json:"stop_reason"`
	StopSequence *string         `json:"stop_sequence"`
	Usage        anthropicUsage  `json:"usage"`
}

// Stream events, as structs so that "type" leads each event as in
// Anthropic's own stream. Every text response has a single block, index 0.

type anthropicMessageStart struct {
	Type    string            `json:"type"`
	Message anthropicResponse `json:"message"`
}

type anthropicBlockStart struct {
	Type         string        `json:"type"`
	Index        int           `json:"index"`
	ContentBlock anthropicText `json:"content_block"`
}

type anthropicTextDelta struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type anthropicBlockDelta struct {
	Type  string             `json:"type"`
	Index int                `json:"index"`
	Delta anthropicTextDelta `json:"delta"`
}

type anthropicBlockStop struct {
	Type  string `json:"type"`
	Index int    `json:"index"`
}

type anthropicStop struct {
	StopReason   string  `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
}

type anthropicMessageDelta struct {
	Type  string         `json:"type"`
	Delta anthropicStop  `json:"delta"`
	Usage anthropicUsage `json:"usage"`
}

type anthropicMessageStop struct {
	Type string `json:"type"`
}

// anthropicStopReason mirrors finishReason: "max_tokens" when the client's
// limit stopped generation, "end_turn" otherwise.
func anthropicStopReason(j *job) string {
	if j.capped {
		return "max_tokens"
	}
	return "end_turn"
}

func (s *Server) serveMessages(ctx context.Context, w http.ResponseWriter, r *http.Request) error {
	var req messagesRequest
	prepare := func() (*job, *apiError) {
		if len(req.Messages) == 0 {
			return nil, badRequest("messages: at least one message is required", "messages")
		}
		prompt, err := renderAnthropic(req.Tools, req.System, req.Messages)
		if err != nil {
			return nil, badRequest(err.Error(), "messages")
		}
		// Anthropic requires max_tokens; accepting its absence keeps hand-written
		// curl tests short and costs nothing.
		// vLLM's Messages request has no cache_salt (and drops fields it
		// does not know): the cache is shared whatever the client sends.
		return s.newJob(r, req.Model, nil, prompt, req.Stream, namedLimit{"max_tokens", req.MaxTokens})
	}
	return s.serveGeneration(ctx, w, r, styleAnthropic, &req, prepare, func(j *job) reply {
		id := newID("msg_")
		stop := anthropicStopReason(j)
		return reply{
			whole: func(out string) any {
				return anthropicResponse{
					ID: id, Type: "message", Role: "assistant", Model: j.model,
					Content:    []anthropicText{{Type: "text", Text: out}},
					StopReason: &stop,
					Usage:      s.anthropicUsageOf(j, j.maxTokens),
				}
			},
			open: func(sw *sseWriter) error {
				if err := sw.event("message_start", anthropicMessageStart{
					Type: "message_start",
					Message: anthropicResponse{
						ID: id, Type: "message", Role: "assistant", Model: j.model,
						Content: []anthropicText{},
						Usage:   s.anthropicUsageOf(j, 0),
					},
				}); err != nil {
					return err
				}
				return sw.event("content_block_start", anthropicBlockStart{
					Type: "content_block_start", ContentBlock: anthropicText{Type: "text", Text: ""},
				})
			},
			token: func(sw *sseWriter, tok string) error {
				return sw.event("content_block_delta", anthropicBlockDelta{
					Type: "content_block_delta", Delta: anthropicTextDelta{Type: "text_delta", Text: tok},
				})
			},
			close: func(sw *sseWriter) error {
				if err := sw.event("content_block_stop", anthropicBlockStop{Type: "content_block_stop"}); err != nil {
					return err
				}
				// message_delta carries cumulative usage; the SDK overwrites its
				// message_start values with these.
				if err := sw.event("message_delta", anthropicMessageDelta{
					Type:  "message_delta",
					Delta: anthropicStop{StopReason: stop},
					Usage: s.anthropicUsageOf(j, j.maxTokens),
				}); err != nil {
					return err
				}
				return sw.event("message_stop", anthropicMessageStop{Type: "message_stop"})
			},
		}
	})
}
