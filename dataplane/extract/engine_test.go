package extract

import (
	"bytes"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/cartrouter/cart/dataplane/apierr"
)

// The differential test of extraction against the engines' semantics: a
// vLLM or SGLang server reads a body with Python's json.loads (objects are
// dicts: keys match exactly, the last of a repeated key wins, lone
// surrogate escapes are taken), then pydantic reads the fields it knows by
// their exact names. refParse and refNode.get model that on a tokenizer of
// their own (the standard library's v1 decoder, not the one extraction
// uses), and
// FuzzEngineSemantics holds every body extraction accepts to it: the
// fields a Request reports are what the engine reads, and a chat
// message's record is its role and content as the engine reads them.

// engineEdgeCases are bodies at the edges of what the decoder reads
// differently from a dict: repeated and case-variant names, escapes in
// names and values, invalid UTF-8, nulls, wrong types, numbers, depth.
var engineEdgeCases = []string{
	`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`,
	` {"messages":[{"role":"user","content":"hi"}]} ` + "\n",
	`{"messages":[{"role":"user","content":"hi"}],"Model":"m"}`,
	`{"messages":[{"role":"user","content":"hi"}],"model":"a","model":"b"}`,
	`{"messages":[{"role":"user","content":"hi"}],"mod\u0065l":"m"}`,
	`{"messages":[{"role":"user","content":"hi"}],"ſtream":true}`,
	`{"messages":[{"role":"user","content":"hi"}],"model":"\u00e9\ud83d\ude00","user":"é","cache_salt":"a\"b"}`,
	"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"model\":\"\xff\xfe\"}",
	"{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}",
	`{"messages":[{"role":"user","content":"hi"}],"model":null,"stream":null,"stream_options":null,"user":null}`,
	`{"messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true,"x":1}}`,
	`{"messages":[{"role":"user","content":"hi"}],"stream_options":{"Include_usage":true}}`,
	`{"messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":true,"include_usage":false}}`,
	`{"messages":[{"role":"user","content":"hi"}],"stream_options":{},"stream_options":{"include_usage":true}}`,
	`{"messages":[{"role":"user","content":"hi"}],"stream":1}`,
	`{"messages":[{"role":"user","content":"hi"}],"temperature":-0.5e+3,"n":0,"x":[1,2.0,-3E-2,true,false,null,{},[],{"a":{"b":[]}}]}`,
	`{"messages":[{"role":"user","content":"hi"}],"x":01}`,
	`{"messages":[{"role":"user","content":"hi"}],"x":1.}`,
	`{"messages":[{"role":"user","content":"hi"}],"x":-}`,
	`{"messages":[{"role":"user","content":"hi"}],"x":.5}`,
	`{"messages":[{"role":"user","content":"hi"}],"x":"\x"}`,
	`{"messages":[{"role":"user","content":"hi"}],"x":"\u12"}`,
	"{\"messages\":[{\"role\":\"user\",\"content\":\"h\ti\"}]}",
	`{"messages":[{"role":"user","content":"hi"}],"x":{"é\n":1,"a":2,"a":3}}`,
	`{"messages":[{"role":"user","content":"hi"}],"x":tru}`,
	`{"messages":[{"role":"user","content":"hi"}],"x":[1,]}`,
	`{"messages":[{"role":"user","content":"hi"}],"x":{"a":1,}}`,
	`{"messages":[{"role":"user","content":"hi"}]}}`,
	`{"messages":[{"role":"user","content":"hi"},null]}`,
	`{"messages":[null]}`,
	`{"messages":[]}`,
	`{"messages":null}`,
	`{"messages":{}}`,
	`{"messages":[{"role":"user","content":"hi"}],"messages":[{"role":"user","content":"hi"}]}`,
	`{"messages":[{"role":"system","content":"x-anthropic-billing-header: 1"},{"role":"developer","content":[{"type":"text","text":"x-anthropic-billing-header"},{"type":"text","text":"keep"}]}]}`,
	`{"messages":[{"role":"user","name":"n","tool_call_id":"c","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"https://x/a.png"}}]}]}`,
	`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"1","content":"r"}]}`,
	`{"messages":[{"role":"assistant","tool_calls":[]},{"role":"assistant","function_call":{"name":"f","arguments":{"a":[1]}}}]}`,
	`{"messages":[{"role":"assistant","tool_calls":[{"id":1}]}]}`,
	`{"messages":[{"role":"assistant","function_call":null,"tool_calls":null}]}`,
	`{"messages":[{"role":"user","Content":"hi"}]}`,
	`{"messages":[{"role":"user","content":"hi","role":"user"}]}`,
	`{"messages":[{"role":5,"content":"hi"}]}`,
	`{"messages":[{"role":null,"content":"hi"}]}`,
	`{"messages":[{"role":"user","content":5}]}`,
	`{"messages":[{"role":"user","content":"hi","name":5}]}`,
	`{"messages":[{"role":"user","content":"hi","name":null,"tool_call_id":"\u0000"}]}`,
	`{"messages":[{"role":"\u0075ser","content":"\u0000\n\"x"}]}`,
	`{"messages":[{"role":"user","content":"hi","reasoning_content":{"nested":["é",{"\u00e9":1}]}}]}`,
	`{"x":` + strings.Repeat("[", 300) + strings.Repeat("]", 300) + `,"messages":[{"role":"user","content":"hi"}]}`,
	`{"prompt":"Once upon a time","max_tokens":16,"stream":false}`,
	`{"prompt":["a","b"],"prompt_embeds":null}`,
	`{"prompt":[1,2,3]}`,
	`{"prompt":[[1,2],[3]]}`,
	`{"prompt":[1.5]}`,
	`{"prompt":null,"prompt_embeds":"AAAA"}`,
	`{"prompt":"a","Prompt":"b"}`,
	`{"prompt":"a","prompt":"b"}`,
	`{"prompt":{"a":1}}`,
	`{"prompt":"a","messages":"ignored here"}`,
}

// get is the member name of an object as a Python dict holds it: the
// last of a repeated name wins.
func (n *refNode) get(name string) *refNode {
	if n == nil || n.kind != '{' {
		return nil
	}
	for i := len(n.keys) - 1; i >= 0; i-- {
		if n.keys[i] == name {
			return n.elems[i]
		}
	}
	return nil
}

// text is what a pydantic str field with a default reads: the string, or
// "" for null and absence (another type, the engine refuses).
func (n *refNode) text() string {
	if n == nil || n.kind != '"' {
		return ""
	}
	return n.str
}

func (n *refNode) truth() bool { return n != nil && n.kind == 'b' && n.b }

// absent reports a field the engine reads as missing.
func (n *refNode) absent() bool { return n == nil || n.kind == 'n' }

// engineSeeds are FuzzEngineSemantics' seeds: the edge cases, the seeds
// and stored corpus of FuzzExtract, and FuzzContentValue's values inside
// a chat body and as a prompt. The first byte picks the endpoint.
func engineSeeds(t testing.TB) [][]byte {
	var seeds [][]byte
	for _, b := range engineEdgeCases {
		e := ChatCompletions
		if strings.Contains(b, `"prompt`) {
			e = Completions
		}
		seeds = append(seeds, append([]byte{byte(e - 1)}, b...))
	}
	for e, bodies := range fuzzSeeds {
		for _, b := range bodies {
			seeds = append(seeds, append([]byte{byte(e - 1)}, b...))
		}
	}
	files, err := filepath.Glob("testdata/fuzz/FuzzExtract/*")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		_, val, _ := strings.Cut(string(data), "\n")
		lit, ok := strings.CutPrefix(strings.TrimSpace(val), "[]byte(")
		if !ok {
			continue
		}
		s, err := strconv.Unquote(strings.TrimSuffix(lit, ")"))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		seeds = append(seeds, []byte(s))
	}
	for _, v := range []string{
		`"hi"`, `null`, `[]`, `["a",1]`, `[1,2]`, `[[1],[2,3]]`,
		`[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"https://x"}}]`,
		`[{"type":"input_audio","input_audio":{"data":"AA","format":"wav"},"uuid":"u"}]`,
		`[{"type":"tool_use","id":"1","name":"n","input":{"a":[1,{"b":null}]}}]`,
	} {
		seeds = append(seeds,
			append([]byte{byte(ChatCompletions - 1)}, `{"messages":[{"role":"user","content":`+v+`},{"role":"assistant","tool_calls":[{"id":"1","function":{"name":"f","arguments":`+v+`}}]}]}`...),
			append([]byte{byte(Completions - 1)}, `{"prompt":`+v+`}`...))
	}
	return append(seeds, append([]byte{byte(ChatCompletions - 1)}, chatBody(2000)...))
}

func FuzzEngineSemantics(f *testing.F) {
	for _, s := range engineSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		checkEngineSemantics(t, Endpoint(data[0]%4+1), data[1:])
	})
}

// TestEngineSemanticsSeeds runs the differential check on every seed, so
// that a plain go test covers it too.
func TestEngineSemanticsSeeds(t *testing.T) {
	for _, s := range engineSeeds(t) {
		checkEngineSemantics(t, Endpoint(s[0]%4+1), s[1:])
	}
}

func checkEngineSemantics(t *testing.T, e Endpoint, body []byte) {
	t.Helper()
	r, err := ExtractOptions(e, body, Options{})
	py, ok := refParse(body)
	if err != nil {
		var ae *apierr.Error
		if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
			t.Fatalf("error %v (%T) is not a 400 *apierr.Error", err, err)
		}
		return
	}
	if !ok || py.kind != '{' {
		t.Fatalf("accepted a body json.loads does not read as an object: %q", body)
	}
	for name, got := range map[string][2]string{
		"model":      {r.Model, py.get("model").text()},
		"cache_salt": {r.CacheSalt, py.get("cache_salt").text()},
	} {
		if got[0] != got[1] {
			t.Fatalf("%s %q, the engine reads %q: %q", name, got[0], got[1], body)
		}
	}
	if r.Stream != py.get("stream").truth() {
		t.Fatalf("stream %v, the engine reads %v: %q", r.Stream, !r.Stream, body)
	}
	user := py.get("user").text()
	if e == Messages {
		user = py.get("metadata").get("user_id").text()
	}
	if r.User != user {
		t.Fatalf("user %q, the engine reads %q: %q", r.User, user, body)
	}
	switch e {
	case ChatCompletions, Completions:
		if r.PromptCacheKey != py.get("prompt_cache_key").text() || r.IncludeUsage != py.get("stream_options").get("include_usage").truth() {
			t.Fatalf("prompt_cache_key %q, include_usage %v; the engine reads otherwise: %q", r.PromptCacheKey, r.IncludeUsage, body)
		}
	case Responses:
		if r.PreviousResponseID != py.get("previous_response_id").text() {
			t.Fatalf("previous_response_id %q, the engine reads %q: %q", r.PreviousResponseID, py.get("previous_response_id").text(), body)
		}
	}
	if !utf8.Valid(body) {
		// json.loads refuses these; extraction passes them on (decode.go),
		// reading invalid bytes as U+FFFD where the reference keeps them.
		return
	}
	switch e {
	case ChatCompletions:
		checkChatRecords(t, r.Key, py.get("messages"), body)
	case Completions:
		if p := py.get("prompt"); p != nil && p.kind == '"' && py.get("prompt_embeds").absent() && string(r.Key) != string(appendEscaped(nil, p.str)) {
			t.Fatalf("key %q, the engine's prompt %q: %q", r.Key, p.str, body)
		}
	}
}

// checkChatRecords holds the key's records to the messages as the engine
// reads them: one record per message, and a message of a role and a
// string content only is exactly that role and that content.
func checkChatRecords(t *testing.T, key []byte, msgs *refNode, body []byte) {
	t.Helper()
	if msgs == nil || msgs.kind != '[' {
		t.Fatalf("accepted without a messages array: %q", body)
	}
	records := bytes.Split(key, []byte{sepRecord})
	if len(records) != len(msgs.elems)+1 || len(records[len(msgs.elems)]) != 0 {
		t.Fatalf("%d records for %d messages: %q", len(records)-1, len(msgs.elems), body)
	}
	for i, m := range msgs.elems {
		role, content := m.get("role"), m.get("content")
		if role == nil || role.kind != '"' || content == nil || content.kind != '"' {
			continue
		}
		plain := true
		for _, f := range []string{"name", "tool_call_id", "tool_calls", "function_call"} {
			if v := m.get(f); !v.absent() && !(v.kind == '"' && v.str == "") && !(v.kind == '[' && len(v.elems) == 0) {
				plain = false
			}
		}
		want := append(append(appendEscaped(nil, role.str), sepItem), appendEscaped(nil, content.str)...)
		if plain && !bytes.Equal(records[i], want) {
			t.Fatalf("message %d: record %q, the engine reads %q: %q", i, records[i], want, body)
		}
	}
}
