package sim

import (
	"bytes"
	"encoding/json"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestMalformedRequestsGetInvalidRequestErrors(t *testing.T) {
	_, ts := startReplica(t, Config{})
	cases := []struct {
		name, path, body string
	}{
		{"broken json", pathChat, `{"messages": [`},
		{"no messages", pathChat, `{"model":"m"}`},
		{"bad content", pathChat, `{"messages":[{"role":"user","content":42}]}`},
		{"no role", pathChat, `{"messages":[{"content":"hi"}]}`},
		{"zero max_tokens", pathChat, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":0}`},
		{"wrong type", pathChat, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":"many"}`},
		{"completion without prompt", pathCompletions, `{"model":"m"}`},
		{"negative token id", pathCompletions, `{"prompt":[1,-2]}`},
		{"prompt object", pathCompletions, `{"prompt":{"a":1}}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := mustPost(t, ts, tc.path, tc.body)
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			var e struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
				} `json:"error"`
			}
			if err := json.Unmarshal(body, &e); err != nil || e.Error.Type != "invalid_request_error" || e.Error.Message == "" {
				t.Fatalf("body %s (%v)", body, err)
			}
		})
	}

	resp, body := mustPost(t, ts, pathMessages, `{"messages": nope}`)
	var ae struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &ae); err != nil || resp.StatusCode != 400 || ae.Type != "error" || ae.Error.Type != "invalid_request_error" {
		t.Fatalf("anthropic malformed: %d %s", resp.StatusCode, body)
	}
}

func TestRoutingErrors(t *testing.T) {
	_, ts := startReplica(t, Config{})
	resp, body, err := get(t, ts, pathChat)
	if err != nil || resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
		t.Fatalf("GET chat: %v %v %s", resp, err, body)
	}
	resp, body, err = get(t, ts, "/v2/unknown")
	if err != nil || resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), `"error"`) {
		t.Fatalf("unknown path: %v %v %s", resp, err, body)
	}
	if resp.Header.Get("X-Sim-Replica") == "" {
		t.Fatal("404 without X-Sim-Replica")
	}
}

func TestHealthModelsAndHeaders(t *testing.T) {
	_, ts := startReplica(t, Config{Name: "replica-a", Model: "llama-sim"})
	resp, body, err := get(t, ts, "/health")
	if err != nil || resp.StatusCode != http.StatusOK || strings.TrimSpace(string(body)) != `{"status":"ok"}` {
		t.Fatalf("health: %v %s", err, body)
	}
	if got := resp.Header.Get("X-Sim-Replica"); got != "replica-a" {
		t.Fatalf("X-Sim-Replica = %q", got)
	}
	resp, body, err = get(t, ts, "/v1/models")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("models: %v %s", err, body)
	}
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &models); err != nil || models.Object != "list" || len(models.Data) != 1 || models.Data[0].ID != "llama-sim" {
		t.Fatalf("models body %s (%v)", body, err)
	}

	// The request id is echoed, and a request without a model gets the
	// configured one.
	req, _ := http.NewRequest(http.MethodPost, ts.URL+pathChat, strings.NewReader(`{"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("X-Request-Id", "req-42")
	resp, err = ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Object string `json:"object"`
		Model  string `json:"model"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.Object != "chat.completion" || out.Model != "llama-sim" {
		t.Fatalf("chat response %+v (%v)", out, err)
	}
	if resp.Header.Get("X-Request-Id") != "req-42" || resp.Header.Get("X-Sim-Replica") != "replica-a" {
		t.Fatalf("headers %v", resp.Header)
	}
}

func TestOutputBudget(t *testing.T) {
	_, ts := startReplica(t, Config{OutputTokens: 3})
	r := complete(t, ts, pathChat, chatBody("hi"))
	if r.Usage.CompletionTokens != 3 || r.Choices[0].FinishReason != "stop" || len(strings.Fields(r.Choices[0].Message.Content)) != 3 {
		t.Fatalf("default budget: %+v", r)
	}
	r = complete(t, ts, pathChat, chatBody("hi", "max_tokens", 9, "max_completion_tokens", 5))
	if r.Usage.CompletionTokens != 5 || r.Choices[0].FinishReason != "length" {
		t.Fatalf("max_completion_tokens must win over max_tokens: %+v", r.Usage)
	}
	r = complete(t, ts, pathCompletions, map[string]any{"prompt": "x", "max_tokens": 1_000_000})
	if r.Usage.CompletionTokens != MaxOutputTokens {
		t.Fatalf("completion tokens %d, want the %d cap", r.Usage.CompletionTokens, MaxOutputTokens)
	}
	if r.Usage.TotalTokens != r.Usage.PromptTokens+r.Usage.CompletionTokens {
		t.Fatalf("usage %+v", r.Usage)
	}
}

func TestAnthropicUsageSemantics(t *testing.T) {
	_, ts := startReplica(t, Config{})
	body := map[string]any{
		"model":    "claude-test",
		"system":   []map[string]any{{"type": "text", "text": strings.Repeat("cached system prompt ", 20), "cache_control": map[string]string{"type": "ephemeral"}}},
		"messages": []map[string]any{{"role": "user", "content": []map[string]any{{"type": "text", "text": "hello"}}}},
	}
	var first, second struct {
		Type       string `json:"type"`
		StopReason string `json:"stop_reason"`
		Usage      struct {
			InputTokens          int `json:"input_tokens"`
			CacheReadInputTokens int `json:"cache_read_input_tokens"`
			OutputTokens         int `json:"output_tokens"`
		} `json:"usage"`
	}
	for _, out := range []any{&first, &second} {
		resp, b := mustPost(t, ts, pathMessages, body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatal(err)
		}
	}
	if first.Type != "message" || first.StopReason != "end_turn" || first.Usage.CacheReadInputTokens != 0 || first.Usage.OutputTokens != DefaultOutputTokens {
		t.Fatalf("first %+v", first)
	}
	total := first.Usage.InputTokens
	if second.Usage.CacheReadInputTokens != total/16*16 || second.Usage.InputTokens != total-second.Usage.CacheReadInputTokens {
		t.Fatalf("second usage %+v, prompt %d tokens", second.Usage, total)
	}
}

func TestMetricsExposed(t *testing.T) {
	_, ts := startReplica(t, Config{})
	complete(t, ts, pathCompletions, tokenPrompt(seq(0, 40)))
	complete(t, ts, pathCompletions, tokenPrompt(seq(0, 40)))
	resp, body, err := get(t, ts, "/metrics")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("metrics: %v %s", err, body)
	}
	for _, want := range []string{
		`sim_requests_total{endpoint="/v1/completions",status="200"} 2`,
		"sim_prompt_tokens_total 80",
		"sim_cached_tokens_total 32",
		"sim_generation_tokens_total 2",
		"sim_running_requests 0",
		"sim_queue_depth 0",
		"sim_cache_blocks 2",
	} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
	if t.Failed() {
		t.Log(string(body))
	}
}

func TestManyReplicasInOneProcess(t *testing.T) {
	// Each replica has its own registry; sharing the default one would
	// panic on duplicate registration here.
	a, b := New(Config{Name: "a"}), New(Config{Name: "b"})
	defer a.Close()
	defer b.Close()
	if a.Config().Name == b.Config().Name {
		t.Fatal("names collapsed")
	}
}

func TestPromptRendering(t *testing.T) {
	if got := tokenCount([]byte("12345")); got != 2 {
		t.Fatalf("tokenCount(5 bytes) = %d, want 2 (ceil)", got)
	}
	if got := tokenCount(nil); got != 0 {
		t.Fatalf("tokenCount(nil) = %d", got)
	}

	msg := func(role, content string) chatMessage {
		return chatMessage{Role: role, Content: json.RawMessage(content)}
	}
	one, err := renderChat(nil, []chatMessage{msg("user", `"hello"`)})
	if err != nil {
		t.Fatal(err)
	}
	if string(one) != "<|user|>\nhello\n<|assistant|>\n" {
		t.Fatalf("rendered %q", one)
	}
	two, _ := renderChat(nil, []chatMessage{msg("user", `"hello"`), msg("assistant", `"hi"`)})
	if !bytes.HasPrefix(two, one) {
		t.Fatal("appending a turn changed the earlier prefix")
	}

	img := func(url string) chatMessage {
		return msg("user", `[{"type":"text","text":"look: "},{"type":"image_url","image_url":{"url":"`+url+`"}}]`)
	}
	catA, _ := renderChat(nil, []chatMessage{img("data:image/png;base64,AAAA")})
	// Same data, different JSON formatting: must render identically.
	catB, _ := renderChat(nil, []chatMessage{msg("user", `[ {"text":"look: ","type":"text"}, {"image_url": {"url": "data:image/png;base64,AAAA"}, "type": "image_url"} ]`)})
	dog, _ := renderChat(nil, []chatMessage{img("data:image/png;base64,BBBB")})
	if !bytes.Equal(catA, catB) {
		t.Fatalf("equivalent requests rendered differently:\n%q\n%q", catA, catB)
	}
	if bytes.Equal(catA, dog) || !bytes.Contains(catA, []byte("look: <|image_url:")) {
		t.Fatalf("image placeholder not data-dependent: %q vs %q", catA, dog)
	}

	withTools, _ := renderChat(json.RawMessage(`[{"type":"function","function":{"name":"f"}}]`), []chatMessage{msg("user", `"x"`)})
	if !bytes.HasPrefix(withTools, []byte("<|tools|>\n")) {
		t.Fatalf("tools not rendered first: %q", withTools)
	}

	anth, err := renderAnthropic(nil, json.RawMessage(`"sys"`), []anthropicMessage{{Role: "user", Content: json.RawMessage(`[{"type":"text","text":"q"},{"type":"image","source":{"data":"AAAA"}}]`)}})
	if err != nil || !bytes.HasPrefix(anth, []byte("<|system|>\nsys\n<|user|>\nq<|image:")) {
		t.Fatalf("anthropic rendered %q (%v)", anth, err)
	}

	ids, err := renderCompletionPrompt(json.RawMessage(`[[1,2,3],[4]]`))
	if err != nil || tokenCount(ids) != 4 {
		t.Fatalf("token ids rendered to %d tokens (%v), want 4", tokenCount(ids), err)
	}
	strs, err := renderCompletionPrompt(json.RawMessage(`["ab","cd"]`))
	if err != nil || string(strs) != "abcd" {
		t.Fatalf("string list rendered %q (%v)", strs, err)
	}
}

func TestConfigValidation(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("zero config rejected: %v", err)
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("default config rejected: %v", err)
	}
	for name, c := range map[string]Config{
		"negative block":   {BlockTokens: -1},
		"negative slots":   {MaxConcurrency: -2},
		"too many outputs": {OutputTokens: MaxOutputTokens + 1},
		"NaN prefill":      {PrefillUsPerToken: math.NaN()},
		"negative scale":   {TimeScale: -1},
		"infinite decode":  {DecodeMsPerToken: math.Inf(1)},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
	got := New(Config{}).Config()
	if got.Name != DefaultName || got.Model != DefaultModel || got.BlockTokens != 16 || got.MaxConcurrency != 1 || got.OutputTokens != 16 || got.TimeScale != 0 {
		t.Fatalf("defaults filled as %+v", got)
	}
}

func TestDecodeDelayGrowsWithRunningRequests(t *testing.T) {
	s := New(DefaultConfig())
	if got := s.decodeDelay(1); got != 5*time.Millisecond {
		t.Fatalf("lone decode step %v, want 5ms", got)
	}
	if got := s.decodeDelay(11); got != 7500*time.Microsecond {
		t.Fatalf("step with 10 others %v, want 5ms × 1.5", got)
	}
	half := New(Config{DecodeMsPerToken: 5, TimeScale: 0.5})
	if got := half.decodeDelay(1); got != 2500*time.Microsecond {
		t.Fatalf("scaled step %v, want 2.5ms", got)
	}
	if got := s.scaled(math.MaxFloat64, time.Hour); got != math.MaxInt64 {
		t.Fatalf("overflowing delay = %v, want saturation", got)
	}
}
