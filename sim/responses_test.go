package sim

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	openaiopt "github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

type responseResult struct {
	ID                 string  `json:"id"`
	Object             string  `json:"object"`
	Status             string  `json:"status"`
	Model              string  `json:"model"`
	PreviousResponseID *string `json:"previous_response_id"`
	IncompleteDetails  *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
	Output []struct {
		ID      string `json:"id"`
		Type    string `json:"type"`
		Role    string `json:"role"`
		Status  string `json:"status"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Usage struct {
		InputTokens        int `json:"input_tokens"`
		InputTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
		OutputTokens int `json:"output_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

func (r responseResult) text() string {
	if len(r.Output) != 1 || len(r.Output[0].Content) != 1 {
		return ""
	}
	return r.Output[0].Content[0].Text
}

func respond(t *testing.T, ts *httptest.Server, body map[string]any) responseResult {
	t.Helper()
	var r responseResult
	if err := json.Unmarshal(mustBody(t, ts, pathResponses, body, http.StatusOK), &r); err != nil {
		t.Fatal(err)
	}
	return r
}

var longInstructions = strings.Repeat("You are a careful assistant for the CART router. ", 8)

func TestResponsesNonStreamed(t *testing.T) {
	_, ts := startReplica(t, Config{Model: "m", OutputTokens: 4})
	r := respond(t, ts, map[string]any{"input": "hello", "instructions": longInstructions})
	if r.Object != "response" || !strings.HasPrefix(r.ID, "resp_") || r.Status != "completed" || r.Model != "m" ||
		len(r.Output) != 1 || r.Output[0].Type != "message" || r.Output[0].Role != "assistant" ||
		r.Output[0].Content[0].Type != "output_text" || len(strings.Fields(r.text())) != 4 {
		t.Fatalf("response %+v", r)
	}
	u := r.Usage
	if u.InputTokens == 0 || u.OutputTokens != 4 || u.TotalTokens != u.InputTokens+4 || u.InputTokensDetails.CachedTokens != 0 {
		t.Fatalf("usage %+v", u)
	}
	again := respond(t, ts, map[string]any{"input": "hello", "instructions": longInstructions})
	if again.Usage.InputTokensDetails.CachedTokens != u.InputTokens/16*16 {
		t.Fatalf("same request cached %d of %d", again.Usage.InputTokensDetails.CachedTokens, u.InputTokens)
	}
	capped := respond(t, ts, map[string]any{"input": "hello", "max_output_tokens": 2})
	if capped.Status != "incomplete" || capped.IncompleteDetails == nil || capped.IncompleteDetails.Reason != "max_output_tokens" || capped.Usage.OutputTokens != 2 {
		t.Fatalf("capped %+v", capped)
	}
}

func TestResponsesPreviousResponseContinuesThePrefix(t *testing.T) {
	_, ts := startReplica(t, Config{OutputTokens: 8})
	first := respond(t, ts, map[string]any{"model": "m", "input": "first question", "instructions": longInstructions})
	second := respond(t, ts, map[string]any{"model": "m", "input": "second question", "instructions": longInstructions, "previous_response_id": first.ID})
	if second.PreviousResponseID == nil || *second.PreviousResponseID != first.ID {
		t.Fatalf("previous_response_id not echoed: %+v", second)
	}
	// The second prompt holds the first prompt and its answer, so the first
	// prompt's blocks are reused (all but a block whose last token was
	// partial) and the prompt grew by more than the answer.
	if c := second.Usage.InputTokensDetails.CachedTokens; c < (first.Usage.InputTokens/16-1)*16 || c == 0 {
		t.Fatalf("continuation cached %d, first prompt was %d tokens", c, first.Usage.InputTokens)
	}
	if second.Usage.InputTokens <= first.Usage.InputTokens+first.Usage.OutputTokens {
		t.Fatalf("continuation prompt %d tokens does not hold the first turn (%d+%d)", second.Usage.InputTokens, first.Usage.InputTokens, first.Usage.OutputTokens)
	}
	third := respond(t, ts, map[string]any{"model": "m", "input": "third", "instructions": longInstructions, "previous_response_id": second.ID})
	if third.Usage.InputTokensDetails.CachedTokens < (second.Usage.InputTokens/16-1)*16 {
		t.Fatalf("third turn cached %d of the second's %d", third.Usage.InputTokensDetails.CachedTokens, second.Usage.InputTokens)
	}
	// Instructions do not carry over: continuing without them drops the
	// system turn, so the prompt no longer starts like the cached ones.
	bare := respond(t, ts, map[string]any{"model": "m", "input": "fourth", "previous_response_id": first.ID})
	if bare.Usage.InputTokensDetails.CachedTokens != 0 {
		t.Fatalf("instructions carried over: cached %d", bare.Usage.InputTokensDetails.CachedTokens)
	}

	unstored := respond(t, ts, map[string]any{"input": "x", "store": false})
	for _, id := range []string{unstored.ID, "resp_never_made_here"} {
		e := decodeError(t, mustBody(t, ts, pathResponses, map[string]any{"input": "y", "previous_response_id": id}, http.StatusNotFound))
		if e.Error.Message != "Response with id '"+id+"' not found." || e.Error.Type != "invalid_request_error" ||
			e.Error.Param == nil || *e.Error.Param != "response_id" || e.Error.Code != float64(404) {
			t.Fatalf("unknown previous id %q: %+v", id, e)
		}
	}

	resp, body, err := get(t, ts, pathResponses+"/"+second.ID)
	var got responseResult
	if err != nil || resp.StatusCode != http.StatusOK || json.Unmarshal(body, &got) != nil || got.ID != second.ID || got.text() != second.text() || got.Status != "completed" {
		t.Fatalf("GET stored: %v %s", err, body)
	}
	if resp, body, _ := get(t, ts, pathResponses+"/"+unstored.ID); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("GET unstored: %d %s", resp.StatusCode, body)
	}
	if resp, body, _ := get(t, ts, pathResponses+"/nope"); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("GET malformed id: %d %s", resp.StatusCode, body)
	}
}

func TestResponsesStreamed(t *testing.T) {
	_, ts := startReplica(t, Config{OutputTokens: 5})
	resp, err := post(t, context.Background(), ts, pathResponses, map[string]any{"input": "stream me", "stream": true})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d %v", resp.StatusCode, resp.Header)
	}
	events, err := newSSEReader(resp.Body).readAll()
	if err.Error() != "EOF" {
		t.Fatal(err)
	}
	var names []string
	var deltas strings.Builder
	var done string
	var completed responseResult
	for i, ev := range events {
		var head struct {
			Type           string         `json:"type"`
			SequenceNumber int            `json:"sequence_number"`
			Delta          string         `json:"delta"`
			Text           string         `json:"text"`
			Response       responseResult `json:"response"`
		}
		if err := json.Unmarshal([]byte(ev.data), &head); err != nil {
			t.Fatal(err)
		}
		if head.Type != ev.name || head.SequenceNumber != i {
			t.Fatalf("event %d: name %q type %q sequence %d", i, ev.name, head.Type, head.SequenceNumber)
		}
		names = append(names, ev.name)
		switch head.Type {
		case "response.output_text.delta":
			deltas.WriteString(head.Delta)
		case "response.output_text.done":
			done = head.Text
		case "response.completed":
			completed = head.Response
		case "response.created":
			if head.Response.Status != "in_progress" {
				t.Fatalf("created with status %q", head.Response.Status)
			}
		}
	}
	want := "response.created response.in_progress response.output_item.added response.content_part.added " +
		strings.Repeat("response.output_text.delta ", 5) +
		"response.output_text.done response.content_part.done response.output_item.done response.completed"
	if strings.Join(names, " ") != want {
		t.Fatalf("events %v", names)
	}
	if deltas.String() != done || completed.text() != done || completed.Status != "completed" || completed.Usage.OutputTokens != 5 {
		t.Fatalf("deltas %q, done %q, completed %+v", deltas.String(), done, completed)
	}
	if resp, _, _ := get(t, ts, pathResponses+"/"+completed.ID); resp.StatusCode != http.StatusOK {
		t.Fatal("streamed response not stored")
	}
}

func TestResponsesInputItems(t *testing.T) {
	items := json.RawMessage(`[
		{"role":"developer","content":"be terse"},
		{"type":"message","role":"user","content":[{"type":"input_text","text":"look at "},{"type":"input_image","image_url":"data:image/png;base64,AAAA"}]},
		{"type":"message","role":"assistant","content":[{"type":"output_text","text":"a cat"}]},
		{"type":"function_call","call_id":"c1","name":"lookup","arguments":"{}"},
		{"type":"function_call_output","call_id":"c1","output":"found"},
		{"type":"reasoning","id":"r1","summary":[]}
	]`)
	msgs, err := responsesInput(items)
	if err != nil {
		t.Fatal(err)
	}
	prompt, err := renderChat(nil, msgs)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"<|developer|>\nbe terse\n",
		"<|user|>\nlook at <|input_image:",
		"<|assistant|>\na cat\n",
		`<|tool_calls|>{"arguments":"{}","call_id":"c1","name":"lookup","type":"function_call"}`,
		"<|tool|>\nfound\n",
		"<|reasoning|>\n<|reasoning:",
	} {
		if !strings.Contains(string(prompt), want) {
			t.Errorf("rendered prompt lacks %q:\n%s", want, prompt)
		}
	}
	other, _ := responsesInput(json.RawMessage(strings.Replace(string(items), "AAAA", "BBBB", 1)))
	otherPrompt, _ := renderChat(nil, other)
	if string(otherPrompt) == string(prompt) {
		t.Fatal("a different image rendered the same prompt")
	}

	_, ts := startReplica(t, Config{})
	respond(t, ts, map[string]any{"input": items})
	for name, input := range map[string]any{
		"number":      42,
		"object":      map[string]any{"role": "user"},
		"empty":       "",
		"no list":     []any{},
		"not objects": []any{"hi"},
		"no type":     []any{map[string]any{"content": "hi"}},
		"bad content": []any{map[string]any{"role": "user", "content": 7}},
	} {
		e := decodeError(t, mustBody(t, ts, pathResponses, map[string]any{"input": input}, http.StatusBadRequest))
		if e.Error.Type != "invalid_request_error" || e.Error.Param == nil || *e.Error.Param != "input" {
			t.Errorf("%s: %+v", name, e)
		}
	}
	mustBody(t, ts, pathResponses, map[string]any{"input": "x", "max_output_tokens": 0}, http.StatusBadRequest)
}

func TestResponseStoreIsBounded(t *testing.T) {
	s, ts := startReplica(t, Config{StoredResponses: 2})
	var ids []string
	for range 3 {
		ids = append(ids, respond(t, ts, map[string]any{"input": "x"}).ID)
	}
	if s.stored.len() != 2 {
		t.Fatalf("store holds %d", s.stored.len())
	}
	mustBody(t, ts, pathResponses, map[string]any{"input": "y", "previous_response_id": ids[0]}, http.StatusNotFound)
	respond(t, ts, map[string]any{"input": "y", "previous_response_id": ids[2]})
}

// TestOpenAISDKResponses drives the Responses API with the official Go SDK,
// streamed and not, across a previous_response_id chain.
func TestOpenAISDKResponses(t *testing.T) {
	_, ts := startReplica(t, Config{Models: []string{"sim-model"}, OutputTokens: 6})
	client := openai.NewClient(
		openaiopt.WithBaseURL(ts.URL+"/v1/"),
		openaiopt.WithAPIKey("test"),
		openaiopt.WithHTTPClient(ts.Client()),
		openaiopt.WithMaxRetries(0),
	)
	ctx := context.Background()
	first, err := client.Responses.New(ctx, responses.ResponseNewParams{
		Model:        "sim-model",
		Instructions: openai.String(longInstructions),
		Input:        responses.ResponseNewParamsInputUnion{OfString: openai.String("What is CART?")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if first.Status != responses.ResponseStatusCompleted || len(strings.Fields(first.OutputText())) != 6 || first.Usage.OutputTokens != 6 || first.Usage.InputTokens == 0 {
		t.Fatalf("first response %+v", first)
	}

	stream := client.Responses.NewStreaming(ctx, responses.ResponseNewParams{
		Model:              "sim-model",
		Instructions:       openai.String(longInstructions),
		PreviousResponseID: openai.String(first.ID),
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
			responses.ResponseInputItemParamOfMessage("And why?", responses.EasyInputMessageRoleUser),
		}},
	})
	var text strings.Builder
	var completed responses.Response
	seq := int64(0)
	for stream.Next() {
		ev := stream.Current()
		if ev.SequenceNumber != seq {
			t.Fatalf("event %q has sequence %d, want %d", ev.Type, ev.SequenceNumber, seq)
		}
		seq++
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.Delta)
		case "response.completed":
			completed = ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	stream.Close()
	if completed.OutputText() != text.String() || completed.Usage.InputTokensDetails.CachedTokens < (first.Usage.InputTokens/16-1)*16 {
		t.Fatalf("streamed continuation: text %q vs %q, usage %+v", completed.OutputText(), text.String(), completed.Usage)
	}

	got, err := client.Responses.Get(ctx, completed.ID, responses.ResponseGetParams{})
	if err != nil || got.OutputText() != text.String() {
		t.Fatalf("Get: %v %+v", err, got)
	}
	_, err = client.Responses.New(ctx, responses.ResponseNewParams{
		Model:              "sim-model",
		PreviousResponseID: openai.String("resp_elsewhere"),
		Input:              responses.ResponseNewParamsInputUnion{OfString: openai.String("x")},
	})
	var apiErr *openai.Error
	if !asError(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown previous id: %v", err)
	}
}

func asError(err error, target **openai.Error) bool { return errors.As(err, target) }
