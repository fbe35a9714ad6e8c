package sim

import (
	"bytes"
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
)

// The OpenAI Responses API as vLLM serves it: input as a string or a list of
// items, instructions as a system turn, optional streaming, and an in-memory
// store that lets previous_response_id continue a conversation on the
// replica that produced it, and on no other.

type responsesRequest struct {
	kvField
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	Tools              json.RawMessage `json:"tools"`
	Stream             bool            `json:"stream"`
	Store              *bool           `json:"store"`
	PreviousResponseID *string         `json:"previous_response_id"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Metadata           json.RawMessage `json:"metadata"`
	Temperature        *float64        `json:"temperature"`
	TopP               *float64        `json:"top_p"`
	CacheSalt          *string         `json:"cache_salt"`
}

// responseObject is a Response as OpenAI's SDKs decode it. Fields the
// simulator has no use for are sent with their neutral values because the
// SDKs treat them as required.
type responseObject struct {
	ID                 string             `json:"id"`
	Object             string             `json:"object"`
	CreatedAt          int64              `json:"created_at"`
	Status             string             `json:"status"`
	Background         bool               `json:"background"`
	Error              json.RawMessage    `json:"error"`
	IncompleteDetails  *incompleteDetails `json:"incomplete_details"`
	Instructions       *string            `json:"instructions"`
	MaxOutputTokens    *int               `json:"max_output_tokens"`
	Metadata           json.RawMessage    `json:"metadata"`
	Model              string             `json:"model"`
	Output             []outputMessage    `json:"output"`
	ParallelToolCalls  bool               `json:"parallel_tool_calls"`
	PreviousResponseID *string            `json:"previous_response_id"`
	Store              bool               `json:"store"`
	Temperature        float64            `json:"temperature"`
	Text               json.RawMessage    `json:"text"`
	ToolChoice         string             `json:"tool_choice"`
	Tools              json.RawMessage    `json:"tools"`
	TopP               float64            `json:"top_p"`
	Truncation         string             `json:"truncation"`
	Usage              *responsesUsage    `json:"usage"`
}

type incompleteDetails struct {
	Reason string `json:"reason"`
}

type outputMessage struct {
	ID      string       `json:"id"`
	Type    string       `json:"type"`
	Role    string       `json:"role"`
	Status  string       `json:"status"`
	Content []outputText `json:"content"`
}

type outputText struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
	Logprobs    []any  `json:"logprobs"`
}

// responsesUsage always carries cached_tokens: vLLM's Responses API reports
// them whatever --enable-prompt-tokens-details says, so NoCacheDetails
// leaves it alone.
type responsesUsage struct {
	InputTokens         int                 `json:"input_tokens"`
	InputTokensDetails  inputTokensDetails  `json:"input_tokens_details"`
	OutputTokens        int                 `json:"output_tokens"`
	OutputTokensDetails outputTokensDetails `json:"output_tokens_details"`
	TotalTokens         int                 `json:"total_tokens"`
}

type inputTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type outputTokensDetails struct {
	ReasoningTokens int `json:"reasoning_tokens"`
}

// responseEvent is one streamed event; each kind uses a subset of fields.
type responseEvent struct {
	Type           string          `json:"type"`
	SequenceNumber int             `json:"sequence_number"`
	Response       *responseObject `json:"response,omitempty"`
	OutputIndex    *int            `json:"output_index,omitempty"`
	ItemID         string          `json:"item_id,omitempty"`
	ContentIndex   *int            `json:"content_index,omitempty"`
	Item           *outputMessage  `json:"item,omitempty"`
	Part           *outputText     `json:"part,omitempty"`
	Delta          *string         `json:"delta,omitempty"`
	Text           *string         `json:"text,omitempty"`
	Logprobs       json.RawMessage `json:"logprobs,omitempty"`
}

var (
	jsonEmptyList   = json.RawMessage("[]")
	jsonEmptyObject = json.RawMessage("{}")
	jsonTextFormat  = json.RawMessage(`{"format":{"type":"text"}}`)
)

// responseNotFound is vLLM's answer for an id its store does not hold.
func responseNotFound(id string) *apiError {
	return notFound(fmt.Sprintf("Response with id '%s' not found.", id), "invalid_request_error", "response_id")
}

// responsesInput turns a Responses input into chat messages: a string is one
// user turn; message items keep their role and content (input_text and
// output_text parts are text, images and files become placeholders);
// function calls render as assistant tool calls and their outputs as tool
// turns; any other item becomes a placeholder turn named after its type, so
// it still shapes the prefix deterministically.
func responsesInput(raw json.RawMessage) ([]chatMessage, error) {
	raw = bytes.TrimSpace(raw)
	if isAbsent(raw) {
		return nil, nil
	}
	switch raw[0] {
	case '"':
		var text string
		if err := json.Unmarshal(raw, &text); err != nil {
			return nil, fmt.Errorf("input: %w", err)
		}
		if text == "" {
			return nil, nil
		}
		return []chatMessage{{Role: "user", Content: raw}}, nil
	case '[':
	default:
		return nil, errors.New("input must be a string or an array of input items")
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("input: %w", err)
	}
	msgs := make([]chatMessage, 0, len(items))
	for i, it := range items {
		var head struct {
			Type    string          `json:"type"`
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
			Output  json.RawMessage `json:"output"`
		}
		if err := json.Unmarshal(it, &head); err != nil {
			return nil, fmt.Errorf("input[%d]: items must be objects: %w", i, err)
		}
		switch {
		case head.Type == "message" || (head.Type == "" && head.Role != ""):
			if head.Role == "" {
				return nil, fmt.Errorf("input[%d].role is required", i)
			}
			msgs = append(msgs, chatMessage{Role: head.Role, Content: head.Content})
		case head.Type == "function_call":
			msgs = append(msgs, chatMessage{Role: "assistant", ToolCalls: it})
		case head.Type == "function_call_output":
			msgs = append(msgs, chatMessage{Role: "tool", Content: head.Output})
		case head.Type == "":
			return nil, fmt.Errorf("input[%d]: an item needs a type or a role", i)
		default:
			msgs = append(msgs, chatMessage{Role: head.Type, Content: append(append(json.RawMessage("["), it...), ']')})
		}
	}
	return msgs, nil
}

// withoutSystem drops system turns: per OpenAI's spec, which vLLM follows,
// instructions do not carry over to the responses that continue this one.
func withoutSystem(msgs []chatMessage) []chatMessage {
	out := make([]chatMessage, 0, len(msgs))
	for _, m := range msgs {
		if m.Role != "system" {
			out = append(out, m)
		}
	}
	return out
}

func (s *Server) serveResponses(ctx context.Context, w http.ResponseWriter, r *http.Request) error {
	var req responsesRequest
	var msgs []chatMessage
	prepare := func() (*job, *apiError) {
		if _, ok := s.models.resolve(req.Model); !ok {
			return nil, modelNotFound(req.Model)
		}
		var history []chatMessage
		if req.PreviousResponseID != nil {
			prev := s.stored.get(*req.PreviousResponseID)
			if prev == nil {
				return nil, responseNotFound(*req.PreviousResponseID)
			}
			history = prev.history
		}
		input, err := responsesInput(req.Input)
		if err != nil {
			return nil, badRequest(err.Error(), "input")
		}
		if len(input) == 0 {
			return nil, badRequest("input must be a non-empty string or array of input items", "input")
		}
		if req.Instructions != nil && *req.Instructions != "" {
			msgs = append(msgs, chatMessage{Role: "system", Content: mustJSON(*req.Instructions)})
		}
		msgs = append(append(msgs, history...), input...)
		prompt, err := renderChat(req.Tools, msgs)
		if err != nil {
			return nil, badRequest(err.Error(), "input")
		}
		return s.newJob(r, req.Model, req.CacheSalt, prompt, req.Stream, namedLimit{"max_output_tokens", req.MaxOutputTokens})
	}
	return s.serveGeneration(ctx, w, r, styleOpenAI, &req, prepare, func(j *job) reply {
		return s.responsesReply(j, &req, msgs)
	})
}

// responsesReply shapes a Response for the conversation msgs and, once it is
// complete, stores it for previous_response_id.
func (s *Server) responsesReply(j *job, req *responsesRequest, msgs []chatMessage) reply {
	resp := newResponseObject(j, req)
	msg := outputMessage{ID: newID("msg_"), Type: "message", Role: "assistant", Status: "in_progress", Content: []outputText{}}
	// finish completes resp with the generated text and stores it, together
	// with the conversation so far, for previous_response_id.
	finish := func(out string) {
		msg.Status = "completed"
		msg.Content = []outputText{newOutputText(out)}
		resp.Output = []outputMessage{msg}
		resp.Status = "completed"
		if j.capped {
			resp.Status = "incomplete"
			resp.IncompleteDetails = &incompleteDetails{Reason: "max_output_tokens"}
		}
		resp.Usage = &responsesUsage{
			InputTokens:        j.promptTokens,
			InputTokensDetails: inputTokensDetails{CachedTokens: j.cachedTokens},
			OutputTokens:       j.maxTokens,
			TotalTokens:        j.promptTokens + j.maxTokens,
		}
		if resp.Store {
			turns := append(withoutSystem(msgs), chatMessage{Role: "assistant", Content: mustJSON(out)})
			s.stored.put(resp.ID, &storedResponse{history: turns, body: *resp})
		}
	}

	var es *responseEvents
	zero := 0
	var streamed strings.Builder
	return reply{
		whole: func(out string) any {
			finish(out)
			return resp
		},
		open: func(sw *sseWriter) error {
			es = &responseEvents{sw: sw}
			snapshot := *resp
			added := msg
			empty := newOutputText("")
			return es.sendAll(
				responseEvent{Type: "response.created", Response: &snapshot},
				responseEvent{Type: "response.in_progress", Response: &snapshot},
				responseEvent{Type: "response.output_item.added", OutputIndex: &zero, Item: &added},
				responseEvent{Type: "response.content_part.added", OutputIndex: &zero, ItemID: msg.ID, ContentIndex: &zero, Part: &empty},
			)
		},
		token: func(_ *sseWriter, tok string) error {
			streamed.WriteString(tok)
			return es.send(responseEvent{Type: "response.output_text.delta", OutputIndex: &zero, ItemID: msg.ID, ContentIndex: &zero, Delta: &tok, Logprobs: jsonEmptyList})
		},
		close: func(*sseWriter) error {
			full := streamed.String()
			finish(full)
			part := newOutputText(full)
			return es.sendAll(
				responseEvent{Type: "response.output_text.done", OutputIndex: &zero, ItemID: msg.ID, ContentIndex: &zero, Text: &full, Logprobs: jsonEmptyList},
				responseEvent{Type: "response.content_part.done", OutputIndex: &zero, ItemID: msg.ID, ContentIndex: &zero, Part: &part},
				responseEvent{Type: "response.output_item.done", OutputIndex: &zero, Item: &msg},
				// vLLM ends every stream with response.completed, even when the
				// response is incomplete; the status inside says which.
				responseEvent{Type: "response.completed", Response: resp},
			)
		},
	}
}

func newOutputText(text string) outputText {
	return outputText{Type: "output_text", Text: text, Annotations: []any{}, Logprobs: []any{}}
}

// newResponseObject returns the in-progress response for a request.
func newResponseObject(j *job, req *responsesRequest) *responseObject {
	resp := &responseObject{
		ID:                 newID("resp_"),
		Object:             "response",
		CreatedAt:          time.Now().Unix(),
		Status:             "in_progress",
		Error:              jsonNull,
		Instructions:       req.Instructions,
		MaxOutputTokens:    req.MaxOutputTokens,
		Metadata:           jsonEmptyObject,
		Model:              j.model,
		Output:             []outputMessage{},
		ParallelToolCalls:  true,
		PreviousResponseID: req.PreviousResponseID,
		Store:              req.Store == nil || *req.Store,
		Temperature:        1,
		Text:               jsonTextFormat,
		ToolChoice:         "auto",
		Tools:              jsonEmptyList,
		TopP:               1,
		Truncation:         "disabled",
	}
	if !isAbsent(req.Metadata) {
		resp.Metadata = req.Metadata
	}
	if !isAbsent(req.Tools) {
		resp.Tools = req.Tools
	}
	if req.Temperature != nil {
		resp.Temperature = *req.Temperature
	}
	if req.TopP != nil {
		resp.TopP = *req.TopP
	}
	return resp
}

// responseEvents numbers a Responses stream's events from 0, as OpenAI does.
type responseEvents struct {
	sw  *sseWriter
	seq int
}

func (es *responseEvents) send(ev responseEvent) error {
	ev.SequenceNumber = es.seq
	es.seq++
	return es.sw.event(ev.Type, ev)
}

// sendAll sends evs in order, stopping at the first that fails.
func (es *responseEvents) sendAll(evs ...responseEvent) error {
	for _, ev := range evs {
		if err := es.send(ev); err != nil {
			return err
		}
	}
	return nil
}

// serveGetResponse answers GET /v1/responses/{id} from the store.
func (s *Server) serveGetResponse(_ context.Context, w http.ResponseWriter, r *http.Request) error {
	id := strings.TrimPrefix(r.URL.Path, pathResponses+"/")
	switch {
	case id == "" || strings.Contains(id, "/"):
		serveNotFound(w, r)
	case !strings.HasPrefix(id, "resp"):
		badRequest(fmt.Sprintf("Invalid 'response_id': '%s'. Expected an ID that begins with 'resp'.", id), "response_id").write(w, styleOpenAI)
	default:
		st := s.stored.get(id)
		if st == nil {
			responseNotFound(id).write(w, styleOpenAI)
			return nil
		}
		writeJSON(w, http.StatusOK, st.body)
	}
	return nil
}

// storedResponse is what previous_response_id needs: the conversation as
// chat turns (without system turns, ending with this response's output)
// and the response itself for GET.
type storedResponse struct {
	history []chatMessage
	body    responseObject
}

// responseStore is a bounded LRU of stored responses. vLLM's store is an
// unbounded dict; bounding it keeps a long benchmark from growing without
// limit, and the bound is far above what any test chain needs.
type responseStore struct {
	mu       sync.Mutex
	capacity int
	byID     map[string]*list.Element
	lru      list.List // of storedEntry; front = most recently used
}

type storedEntry struct {
	id   string
	resp *storedResponse
}

func newResponseStore(capacity int) *responseStore {
	return &responseStore{capacity: capacity, byID: make(map[string]*list.Element)}
}

func (st *responseStore) get(id string) *storedResponse {
	st.mu.Lock()
	defer st.mu.Unlock()
	e, ok := st.byID[id]
	if !ok {
		return nil
	}
	st.lru.MoveToFront(e)
	return e.Value.(storedEntry).resp
}

func (st *responseStore) put(id string, resp *storedResponse) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.byID[id] = st.lru.PushFront(storedEntry{id: id, resp: resp})
	for st.lru.Len() > st.capacity {
		oldest := st.lru.Back()
		st.lru.Remove(oldest)
		delete(st.byID, oldest.Value.(storedEntry).id)
	}
}

func (st *responseStore) len() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.lru.Len()
}
