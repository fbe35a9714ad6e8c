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
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
}

type completionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	MaxTokens     *int            `json:"max_tokens"`
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
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   *usage       `json:"usage"`
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
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
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
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
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
	if aerr, err := readJSON(ctx, w, r, &req); err != nil {
		return err
	} else if aerr != nil {
		aerr.write(w, styleOpenAI)
		return nil
	}
	if len(req.Messages) == 0 {
		badRequest("messages must be a non-empty array", "messages").write(w, styleOpenAI)
		return nil
	}
	prompt, err := renderChat(req.Tools, req.Messages)
	if err != nil {
		badRequest(err.Error(), "messages").write(w, styleOpenAI)
		return nil
	}
	j, aerr := s.newJob(r, req.Model, prompt)
	if aerr != nil {
		aerr.write(w, styleOpenAI)
		return nil
	}
	j.stream = req.Stream
	j.includeUsage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	// max_completion_tokens supersedes the deprecated max_tokens.
	if aerr := s.outputBudget(j, namedLimit{"max_completion_tokens", req.MaxCompletionTokens}, namedLimit{"max_tokens", req.MaxTokens}); aerr != nil {
		aerr.write(w, styleOpenAI)
		return nil
	}

	done, err := s.admit(ctx, j)
	if err != nil {
		return err
	}
	defer done()
	setUsageHeaders(w, j)

	id, created := newID("chatcmpl-"), time.Now().Unix()
	text := newFillerText(s.textSeed(j))
	dec := s.newDecoder(ctx)
	if !j.stream {
		out, err := dec.generate(text, j.maxTokens)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, chatCompletion{
			ID: id, Object: "chat.completion", Created: created, Model: j.model,
			Choices: []chatChoice{{
				Message:      chatOutMessage{Role: "assistant", Content: out},
				Logprobs:     jsonNull,
				FinishReason: finishReason(j),
			}},
			Usage: s.usageOf(j, j.maxTokens),
		})
		return nil
	}

	sw, err := startSSE(w)
	if err != nil {
		return err
	}
	chunk := func(d chatDelta, finish *string) chatChunk {
		return chatChunk{
			ID: id, Object: "chat.completion.chunk", Created: created, Model: j.model,
			Choices: []chatChunkChoice{{Delta: d, Logprobs: jsonNull, FinishReason: finish}},
		}
	}
	// Like OpenAI, the first chunk only announces the role.
	empty := ""
	if err := sw.event("", chunk(chatDelta{Role: "assistant", Content: &empty}, nil)); err != nil {
		return err
	}
	for range j.maxTokens {
		if err := dec.step(); err != nil {
			return err
		}
		tok := text.next()
		if err := sw.event("", chunk(chatDelta{Content: &tok}, nil)); err != nil {
			return err
		}
	}
	reason := finishReason(j)
	if err := sw.event("", chunk(chatDelta{}, &reason)); err != nil {
		return err
	}
	if j.includeUsage {
		final := chatChunk{
			ID: id, Object: "chat.completion.chunk", Created: created, Model: j.model,
			Choices: []chatChunkChoice{}, Usage: s.usageOf(j, j.maxTokens),
		}
		if err := sw.event("", final); err != nil {
			return err
		}
	}
	return sw.send("", []byte("[DONE]"))
}

func (s *Server) serveCompletions(ctx context.Context, w http.ResponseWriter, r *http.Request) error {
	var req completionRequest
	if aerr, err := readJSON(ctx, w, r, &req); err != nil {
		return err
	} else if aerr != nil {
		aerr.write(w, styleOpenAI)
		return nil
	}
	prompt, err := renderCompletionPrompt(req.Prompt)
	if err != nil {
		badRequest(err.Error(), "prompt").write(w, styleOpenAI)
		return nil
	}
	j, aerr := s.newJob(r, req.Model, prompt)
	if aerr != nil {
		aerr.write(w, styleOpenAI)
		return nil
	}
	j.stream = req.Stream
	j.includeUsage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	if aerr := s.outputBudget(j, namedLimit{"max_tokens", req.MaxTokens}); aerr != nil {
		aerr.write(w, styleOpenAI)
		return nil
	}

	done, err := s.admit(ctx, j)
	if err != nil {
		return err
	}
	defer done()
	setUsageHeaders(w, j)

	id, created := newID("cmpl-"), time.Now().Unix()
	text := newFillerText(s.textSeed(j))
	dec := s.newDecoder(ctx)
	reason := finishReason(j)
	if !j.stream {
		out, err := dec.generate(text, j.maxTokens)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, textCompletion{
			ID: id, Object: "text_completion", Created: created, Model: j.model,
			Choices: []textChoice{{Text: out, Logprobs: jsonNull, FinishReason: &reason}},
			Usage:   s.usageOf(j, j.maxTokens),
		})
		return nil
	}

	sw, err := startSSE(w)
	if err != nil {
		return err
	}
	chunk := func(t string, finish *string) textCompletion {
		return textCompletion{
			ID: id, Object: "text_completion", Created: created, Model: j.model,
			Choices: []textChoice{{Text: t, Logprobs: jsonNull, FinishReason: finish}},
		}
	}
	for range j.maxTokens {
		if err := dec.step(); err != nil {
			return err
		}
		if err := sw.event("", chunk(text.next(), nil)); err != nil {
			return err
		}
	}
	if err := sw.event("", chunk("", &reason)); err != nil {
		return err
	}
	if j.includeUsage {
		final := textCompletion{
			ID: id, Object: "text_completion", Created: created, Model: j.model,
			Choices: []textChoice{}, Usage: s.usageOf(j, j.maxTokens),
		}
		if err := sw.event("", final); err != nil {
			return err
		}
	}
	return sw.send("", []byte("[DONE]"))
}
