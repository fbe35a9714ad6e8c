package sim

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

type modelList struct {
	Object string `json:"object"`
	Data   []struct {
		ID          string  `json:"id"`
		Object      string  `json:"object"`
		Created     int64   `json:"created"`
		OwnedBy     string  `json:"owned_by"`
		Root        *string `json:"root"`
		Parent      *string `json:"parent"`
		MaxModelLen *int    `json:"max_model_len"`
	} `json:"data"`
}

func listModels(t *testing.T, ts *httptest.Server) (modelList, map[string]string) {
	t.Helper()
	resp, body, err := get(t, ts, pathModels)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("models: %v %s", err, body)
	}
	var l modelList
	if err := json.Unmarshal(body, &l); err != nil || l.Object != "list" {
		t.Fatalf("models body %s (%v)", body, err)
	}
	// Every card carries all of vLLM's fields, null or not.
	var raw struct {
		Data []map[string]json.RawMessage `json:"data"`
	}
	_ = json.Unmarshal(body, &raw)
	for _, card := range raw.Data {
		for _, k := range []string{"id", "object", "created", "owned_by", "root", "parent", "max_model_len"} {
			if _, ok := card[k]; !ok {
				t.Fatalf("card %v lacks %q", card, k)
			}
		}
	}
	parents := make(map[string]string)
	for _, d := range l.Data {
		p := "<nil>"
		if d.Parent != nil {
			p = *d.Parent
		}
		parents[d.ID] = p
	}
	return l, parents
}

// vllmError is the OpenAI error shape with vLLM's numeric code.
type vllmError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    any     `json:"code"`
	} `json:"error"`
}

func decodeError(t *testing.T, body []byte) vllmError {
	t.Helper()
	var e vllmError
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body %s: %v", body, err)
	}
	return e
}

func TestServedModelsAndUnknownModel(t *testing.T) {
	_, ts := startReplica(t, Config{Models: []string{"base", "alias"}, LoRAModules: []LoRAModule{{Name: "sql", Path: "/adapters/sql"}}})
	l, parents := listModels(t, ts)
	if len(l.Data) != 3 || l.Data[0].ID != "base" || l.Data[1].ID != "alias" || l.Data[2].ID != "sql" {
		t.Fatalf("models %+v", l.Data)
	}
	if *l.Data[0].Root != "base" || parents["base"] != "<nil>" || *l.Data[2].Root != "/adapters/sql" || parents["sql"] != "base" {
		t.Fatalf("root/parent wrong: %+v", l.Data)
	}

	for _, model := range []string{"base", "alias", "sql"} {
		complete(t, ts, pathChat, chatBody("hi", "model", model))
	}
	complete(t, ts, pathCompletions, map[string]any{"prompt": "x"})

	resp, body := mustPost(t, ts, pathChat, chatBody("hi", "model", "nope"))
	e := decodeError(t, body)
	if resp.StatusCode != http.StatusNotFound || e.Error.Message != "The model `nope` does not exist." ||
		e.Error.Type != "NotFoundError" || e.Error.Param == nil || *e.Error.Param != "model" || e.Error.Code != float64(404) {
		t.Fatalf("unknown model: %d %s", resp.StatusCode, body)
	}
	resp, body = mustPost(t, ts, pathCompletions, map[string]any{"model": "nope", "prompt": "x"})
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("completions unknown model: %d %s", resp.StatusCode, body)
	}
	resp, body = mustPost(t, ts, pathMessages, map[string]any{"model": "nope", "max_tokens": 2, "messages": []map[string]any{{"role": "user", "content": "hi"}}})
	var ae struct {
		Type  string `json:"type"`
		Error struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &ae); err != nil || resp.StatusCode != http.StatusNotFound || ae.Type != "error" || ae.Error.Type != "not_found_error" {
		t.Fatalf("messages unknown model: %d %s", resp.StatusCode, body)
	}
	if got := decodeError(t, mustBody(t, ts, pathResponses, map[string]any{"model": "nope", "input": "x"}, http.StatusNotFound)); got.Error.Type != "NotFoundError" {
		t.Fatalf("responses unknown model: %+v", got)
	}
}

// mustBody posts and checks the status, returning the body.
func mustBody(t *testing.T, ts *httptest.Server, path string, body any, status int) []byte {
	t.Helper()
	resp, b := mustPost(t, ts, path, body)
	if resp.StatusCode != status {
		t.Fatalf("POST %s: status %d, want %d: %s", path, resp.StatusCode, status, b)
	}
	return b
}

func TestAnyModelAcceptedWithoutModelList(t *testing.T) {
	_, ts := startReplica(t, Config{Model: "default-name"})
	r := complete(t, ts, pathChat, chatBody("hi", "model", "whatever-the-client-says"))
	if len(r.Choices) != 1 {
		t.Fatalf("%+v", r)
	}
	l, _ := listModels(t, ts)
	if len(l.Data) != 1 || l.Data[0].ID != "default-name" {
		t.Fatalf("models %+v", l.Data)
	}
}

func TestLoRALoadAndUnload(t *testing.T) {
	_, ts := startReplica(t, Config{Models: []string{"base"}})
	load := func(body any, status int) string {
		t.Helper()
		return string(mustBody(t, ts, pathLoadLoRA, body, status))
	}
	if got := load(map[string]any{"lora_name": "sql", "lora_path": "/a/sql"}, http.StatusOK); got != "Success: LoRA adapter 'sql' added successfully." {
		t.Fatalf("load answered %q", got)
	}
	if _, parents := listModels(t, ts); parents["sql"] != "base" {
		t.Fatalf("adapter not listed right after loading: %v", parents)
	}
	complete(t, ts, pathChat, chatBody("hi", "model", "sql"))

	e := decodeError(t, []byte(load(map[string]any{"lora_name": "sql", "lora_path": "/a/other"}, http.StatusBadRequest)))
	if e.Error.Type != "InvalidUserInput" || !strings.Contains(e.Error.Message, "has already been loaded") {
		t.Fatalf("second load: %+v", e)
	}
	load(map[string]any{"lora_name": "sql", "lora_path": "/a/v2", "load_inplace": true}, http.StatusOK)
	if l, _ := listModels(t, ts); *l.Data[1].Root != "/a/v2" {
		t.Fatalf("in-place load kept root %q", *l.Data[1].Root)
	}
	load(map[string]any{"lora_name": "x"}, http.StatusBadRequest)
	load(map[string]any{"lora_name": "base", "lora_path": "/p"}, http.StatusBadRequest)

	if got := string(mustBody(t, ts, pathUnloadLoRA, map[string]any{"lora_name": "sql"}, http.StatusOK)); got != "Success: LoRA adapter 'sql' removed successfully." {
		t.Fatalf("unload answered %q", got)
	}
	e = decodeError(t, mustBody(t, ts, pathUnloadLoRA, map[string]any{"lora_name": "sql"}, http.StatusNotFound))
	if e.Error.Message != "The lora adapter 'sql' cannot be found." {
		t.Fatalf("second unload: %+v", e)
	}
	mustBody(t, ts, pathUnloadLoRA, map[string]any{}, http.StatusBadRequest)
	mustBody(t, ts, pathChat, chatBody("hi", "model", "sql"), http.StatusNotFound)
	if l, _ := listModels(t, ts); len(l.Data) != 1 {
		t.Fatalf("unloaded adapter still listed: %+v", l.Data)
	}
}

func TestAdaptersNeverShareCache(t *testing.T) {
	_, ts := startReplica(t, Config{LoRAModules: []LoRAModule{{Name: "a", Path: "/a"}, {Name: "b", Path: "/b"}}})
	ids := seq(0, 50) // three full blocks
	body := func(model string) map[string]any {
		b := tokenPrompt(ids)
		b["model"] = model
		return b
	}
	cachedFor := func(model string) int {
		return complete(t, ts, pathCompletions, body(model)).Usage.PromptTokensDetails.CachedTokens
	}
	if cachedFor("base") != 0 || cachedFor("base") != 48 {
		t.Fatal("base model does not cache its own prompt")
	}
	if got := cachedFor("a"); got != 0 {
		t.Fatalf("adapter a reused the base model's cache: %d", got)
	}
	if got := cachedFor("b"); got != 0 {
		t.Fatalf("adapter b reused adapter a's cache: %d", got)
	}
	if got := cachedFor("a"); got != 48 {
		t.Fatalf("adapter a does not reuse its own cache: %d", got)
	}
}

func TestNoCacheDetailsOmitsCacheFields(t *testing.T) {
	_, ts := startReplica(t, Config{NoCacheDetails: true})
	system := strings.Repeat("a long shared system prompt ", 20)
	chat := map[string]any{"model": "m", "messages": []map[string]any{{"role": "system", "content": system}, {"role": "user", "content": "hi"}}}
	for range 2 {
		resp, body := mustPost(t, ts, pathChat, chat)
		if resp.StatusCode != http.StatusOK || strings.Contains(string(body), "prompt_tokens_details") || !strings.Contains(string(body), `"prompt_tokens"`) {
			t.Fatalf("chat usage: %s", body)
		}
		if resp.Header.Get("X-Sim-Cached-Tokens") == "" {
			t.Fatal("X-Sim-Cached-Tokens dropped too")
		}
	}
	resp, body := mustPost(t, ts, pathCompletions, map[string]any{"prompt": system})
	if resp.StatusCode != http.StatusOK || strings.Contains(string(body), "prompt_tokens_details") {
		t.Fatalf("completions usage: %s", body)
	}
	stream := chat
	stream["stream"], stream["stream_options"] = true, map[string]any{"include_usage": true}
	resp, body = mustPost(t, ts, pathChat, stream)
	if resp.StatusCode != http.StatusOK || strings.Contains(string(body), "prompt_tokens_details") || !strings.Contains(string(body), `"prompt_tokens"`) {
		t.Fatalf("streamed usage: %s", body)
	}

	msgs := map[string]any{"model": "m", "max_tokens": 2, "system": system, "messages": []map[string]any{{"role": "user", "content": "hi"}}}
	for _, streamed := range []bool{false, true} {
		msgs["stream"] = streamed
		resp, body := mustPost(t, ts, pathMessages, msgs)
		if resp.StatusCode != http.StatusOK || strings.Contains(string(body), "cache_") || !strings.Contains(string(body), `"input_tokens"`) {
			t.Fatalf("messages usage (stream %v): %s", streamed, body)
		}
		if !streamed {
			var m struct {
				Usage struct {
					InputTokens int `json:"input_tokens"`
				} `json:"usage"`
			}
			_ = json.Unmarshal(body, &m)
			if got := resp.Header.Get("X-Sim-Prompt-Tokens"); got == "" || m.Usage.InputTokens == 0 || got != itoa(m.Usage.InputTokens) {
				t.Fatalf("input_tokens %d must be the whole prompt (%s) when cache fields are omitted", m.Usage.InputTokens, got)
			}
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
