package sim

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"time"
)

// OpenAI wire types. Only what clients and the router read is modelled.

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatRequest struct {
	kvField
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Priority            int             `json:"priority"`
	CacheSalt           *string         `json:"cache_salt"`
}

type completionRequest struct {
	kvField
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	MaxTokens     *int            `json:"max_tokens"`
	Priority      int             `json:"priority"`
	CacheSalt     *string         `json:"cache_salt"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	// PromptTokensDetails is nil under Config.NoCacheDetails.
	PromptTokensDetails *promptDetails `json:"prompt_tokens_details,omitempty"`
}

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

func (s *Server) usageOf(j *job, completion int) *usage {
	u := &usage{
		PromptTokens:     j.promptTokens,
		CompletionTokens: completion,
		TotalTokens:      j.promptTokens + completion,
	}
	if !s.cfg.NoCacheDetails {
		u.PromptTokensDetails = &promptDetails{CachedTokens: j.cachedTokens}
	}
	return u
}

type chatCompletion struct {
	openAIHead
	Choices []chatChoice `json:"choices"`
	Usage   *usage       `json:"usage"`
}

// openAIHead leads every OpenAI completion object and chunk; encoding/json
// writes its fields in place, first.
type openAIHead struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
}

type chatChoice struct {
	Index        int             `json:"index"`
	Message      chatOutMessage  `json:"message"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason string          `json:"finish_reason"`
}

type chatOutMessage struct {
	Role    string  `json:"role"`
	Content string  `json:"content"`
	Refusal *string `json:"refusal"`
}

type chatChunk struct {
	openAIHead
	Choices []chatChunkChoice `json:"choices"`
	Usage   *usage            `json:"usage,omitempty"`
}

type chatChunkChoice struct {
	Index        int             `json:"index"`
	Delta        chatDelta       `json:"delta"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
}

type chatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type textCompletion struct {
	openAIHead
	Choices []textChoice `json:"choices"`
	Usage   *usage       `json:"usage,omitempty"`
}

type textChoice struct {
	Text         string          `json:"text"`
	Index        int             `json:"index"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
}

// jsonNull is a pre-encoded null for fields OpenAI always sends as null.
var jsonNull = json.RawMessage("null")

// finishReason is "length" when the client's own limit stopped generation and
// "stop" when the replica chose the length, as a model reaching EOS would.
func finishReason(j *job) string {
	if j.capped {
		return "length"
	}
	return "stop"
}

// newID returns a unique response id with OpenAI's or Anthropic's prefix.
func newID(prefix string) string { return prefix + rand.Text() }

func (s *Server) serveChat(ctx context.Context, w http.ResponseWriter, r *http.Request) error {
	var req chatRequest
	prepare := func() (*job, *apiError) {
		if len(req.Messages) == 0 {
			return nil, badRequest("messages must be a non-empty array", "messages")
		}
		prompt, err := renderChat(req.Tools, req.Messages)
		if err != nil {
			return nil, badRequest(err.Error(), "messages")
		}
		// max_completion_tokens supersedes the deprecated max_tokens.
		j, aerr := s.newJob(r, req.Model, req.CacheSalt, prompt, req.Stream, namedLimit{"max_completion_tokens", req.MaxCompletionTokens}, namedLimit{"max_tokens", req.MaxTokens})
		if j != nil {
			j.includeUsage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
			j.priority = req.Priority
		}
		return j, aerr
	}
	return s.serveGeneration(ctx, w, r, styleOpenAI, &req, prepare, func(j *job) reply {
		id, created := newID("chatcmpl-"), time.Now().Unix()
		chunkHead := openAIHead{ID: id, Object: "chat.completion.chunk", Created: created, Model: j.model}
		chunk := func(d chatDelta, finish *string) chatChunk {
			return chatChunk{
				openAIHead: chunkHead,
				Choices:    []chatChunkChoice{{Delta: d, Logprobs: jsonNull, FinishReason: finish}},
			}
		}
		return reply{
			whole: func(out string) any {
				return chatCompletion{
					openAIHead: openAIHead{ID: id, Object: "chat.completion", Created: created, Model: j.model},
					Choices: []chatChoice{{
						Message:      chatOutMessage{Role: "assistant", Content: out},
						Logprobs:     jsonNull,
						FinishReason: finishReason(j),
					}},
					Usage: s.usageOf(j, j.maxTokens),
				}
			},
			// Like OpenAI, the first chunk only announces the role.
			open: func(sw *sseWriter) error {
				empty := ""
				return sw.event("", chunk(chatDelta{Role: "assistant", Content: &empty}, nil))
			},
			token: func(sw *sseWriter, tok string) error {
				return sw.event("", chunk(chatDelta{Content: &tok}, nil))
			},
			close: func(sw *sseWriter) error {
				reason := finishReason(j)
				if err := sw.event("", chunk(chatDelta{}, &reason)); err != nil {
					return err
				}
				return endOpenAIStream(sw, j, chatChunk{
					openAIHead: chunkHead,
					Choices:    []chatChunkChoice{},
					Usage:      s.usageOf(j, j.maxTokens),
				})
			},
		}
	})
}

func (s *Server) serveCompletions(ctx context.Context, w http.ResponseWriter, r *http.Request) error {
	var req completionRequest
	prepare := func() (*job, *apiError) {
		prompt, err := renderCompletionPrompt(req.Prompt)
		if err != nil {
			return nil, badRequest(err.Error(), "prompt")
		}
		j, aerr := s.newJob(r, req.Model, req.CacheSalt, prompt, req.Stream, namedLimit{"max_tokens", req.MaxTokens})
		if j != nil {
			j.includeUsage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
			j.priority = req.Priority
		}
		return j, aerr
	}
	return s.serveGeneration(ctx, w, r, styleOpenAI, &req, prepare, func(j *job) reply {
		head := openAIHead{ID: newID("cmpl-"), Object: "text_completion", Created: time.Now().Unix(), Model: j.model}
		reason := finishReason(j)
		chunk := func(t string, finish *string) textCompletion {
			return textCompletion{
				openAIHead: head,
				Choices:    []textChoice{{Text: t, Logprobs: jsonNull, FinishReason: finish}},
			}
		}
		return reply{
			whole: func(out string) any {
				whole := chunk(out, &reason)
				whole.Usage = s.usageOf(j, j.maxTokens)
				return whole
			},
			token: func(sw *sseWriter, tok string) error {
				return sw.event("", chunk(tok, nil))
			},
			close: func(sw *sseWriter) error {
				if err := sw.event("", chunk("", &reason)); err != nil {
					return err
				}
				return endOpenAIStream(sw, j, textCompletion{
					openAIHead: head,
					Choices:    []textChoice{},
					Usage:      s.usageOf(j, j.maxTokens),
				})
			},
		}
	})
}

// endOpenAIStream sends the usage chunk when the client asked for one, then
// the [DONE] line that ends every OpenAI stream.
func endOpenAIStream(sw *sseWriter, j *job, usageChunk any) error {
	if j.includeUsage {
		if err := sw.event("", usageChunk); err != nil {
			return err
		}
	}
	return sw.send("", []byte("[DONE]"))
}
