package extract

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/cartrouter/cart/dataplane/apierr"
)

// fastEdgeCases are bodies at the edges of what the fast decoder takes:
// each either decodes exactly as encoding/json does or is handed to it.
var fastEdgeCases = []string{
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

// fastSeeds are the fuzz seeds for the fast decoder: the edge cases, the
// chat and completions seeds and stored corpus of FuzzExtract, and
// FuzzContentValue's values inside a chat body and as a prompt.
func fastSeeds(t testing.TB) [][]byte {
	var seeds [][]byte
	for _, b := range fastEdgeCases {
		e := ChatCompletions
		if strings.Contains(b, `"prompt`) {
			e = Completions
		}
		seeds = append(seeds, append([]byte{byte(e - 1)}, b...))
	}
	for _, e := range []Endpoint{ChatCompletions, Completions} {
		for _, b := range fuzzSeeds[e] {
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
		val = strings.TrimSpace(val)
		lit, ok := strings.CutPrefix(val, "[]byte(")
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
	seeds = append(seeds, append([]byte{byte(ChatCompletions - 1)}, chatBody(2000)...))
	return seeds
}

// FuzzFastDecode is the differential test of the fast decoder against
// encoding/json, which it replaces on the hot path: whenever it takes a
// body, json.Unmarshal must accept it and produce the same struct; and
// extraction with it and without it (the reference) must give the same
// key, fields, media verdict and error (status, type, code, param and
// message) for every input. The first byte picks chat completions or
// completions and whether the item cap is on.
func FuzzFastDecode(f *testing.F) {
	for _, s := range fastSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		body := data[1:]
		e := ChatCompletions
		if data[0]%2 == 1 {
			e = Completions
		}
		checkFastDecode(t, e, body)
		o := Options{IgnoreSystemPrefixes: DefaultIgnoreSystemPrefixes}
		if data[0]&2 != 0 {
			o.MaxItems = 8
		}
		orig := bytes.Clone(body)
		got, gotErr := appendKey(nil, e, body, o, false)
		want, wantErr := appendKey(nil, e, body, o, true)
		if !bytes.Equal(body, orig) {
			t.Fatal("extraction modified the body")
		}
		if (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("fast: %v; reference: %v", gotErr, wantErr)
		}
		if gotErr != nil {
			var g, w *apierr.Error
			if !errors.As(gotErr, &g) || !errors.As(wantErr, &w) || *g != *w {
				t.Fatalf("errors differ:\n fast %#v\n  ref %#v", gotErr, wantErr)
			}
			return
		}
		if !bytes.Equal(got.Key, want.Key) {
			t.Fatalf("keys differ:\n fast %q\n  ref %q", got.Key, want.Key)
		}
		g, w := *got, *want
		g.Key, w.Key = nil, nil
		if !reflect.DeepEqual(g, w) {
			t.Fatalf("requests differ:\n fast %+v\n  ref %+v", g, w)
		}
	})
}

// checkFastDecode compares the fast decoder's struct with json.Unmarshal's.
func checkFastDecode(t *testing.T, e Endpoint, body []byte) (took bool) {
	t.Helper()
	var fast, ref any
	var refErr error
	switch e {
	case ChatCompletions:
		var a, b chatRequest
		took = fastChat(body, &a)
		refErr = json.Unmarshal(body, &b)
		fast, ref = a, b
	case Completions:
		var a, b completionRequest
		took = fastCompletions(body, &a)
		refErr = json.Unmarshal(body, &b)
		fast, ref = a, b
	}
	if !took {
		return false
	}
	if refErr != nil {
		t.Fatalf("fast decoder took a body encoding/json refuses (%v): %q", refErr, body)
	}
	if !reflect.DeepEqual(fast, ref) {
		t.Fatalf("decoded structs differ for %q:\n fast %+v\n  ref %+v", body, fast, ref)
	}
	return true
}

// TestFastDecodeSeeds runs the differential check on every seed, so that
// a plain `go test` covers it too.
func TestFastDecodeSeeds(t *testing.T) {
	for _, s := range fastSeeds(t) {
		e := ChatCompletions
		if s[0]%2 == 1 {
			e = Completions
		}
		checkFastDecode(t, e, s[1:])
	}
}

// TestFastDecodeTakes pins which bodies the fast decoder handles itself:
// the hot path's shapes must not silently fall back to encoding/json, and
// the shapes it cannot reproduce exactly must.
func TestFastDecodeTakes(t *testing.T) {
	for _, tc := range []struct {
		e    Endpoint
		body string
		take bool
	}{
		{ChatCompletions, `{"model":"cart-sim","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, true},
		{ChatCompletions, string(chatBody(5000)), true},
		{ChatCompletions, `{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"stream":true,"stream_options":{"include_usage":true},"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}`, true},
		{ChatCompletions, `{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1","function":{"name":"f","arguments":"{}"}}]}],"user":"é"}`, true},
		{ChatCompletions, `{"messages":[{"role":"user","content":"hi"}],"x":{"é":1}}`, true},
		{Completions, `{"model":"m","prompt":"Once upon a time","max_tokens":16}`, true},
		{Completions, `{"prompt":[1,2,3],"prompt_embeds":null}`, true},

		{ChatCompletions, `{"messages":[{"role":"user","content":"hi"}],"Model":"m"}`, false},
		{ChatCompletions, `{"messages":[{"role":"user","content":"hi"}],"model":"a","model":"b"}`, false},
		{ChatCompletions, `{"messages":[{"role":"user","content":"hi"}],"mod\u0065l":"m"}`, false},
		{ChatCompletions, `{"messages":[{"role":"user","content":"hi"}],"ſtream":true}`, false},
		{ChatCompletions, `{"messages":[{"role":"user","content":"hi"}],"stream":"yes"}`, false},
		{ChatCompletions, `{"messages":[null]}`, false},
		{ChatCompletions, `{"messages":[{"role":"user","content":"hi"}],"x":01}`, false},
		{ChatCompletions, `{"messages":[{"role":"user","content":"hi"}]} x`, false},
		{ChatCompletions, `{"x":` + strings.Repeat("[", 300) + strings.Repeat("]", 300) + `,"messages":[]}`, false},
		{Completions, `{"prompt":"a","Prompt":"b"}`, false},
	} {
		var took bool
		switch tc.e {
		case ChatCompletions:
			took = fastChat([]byte(tc.body), new(chatRequest))
		case Completions:
			took = fastCompletions([]byte(tc.body), new(completionRequest))
		}
		if took != tc.take {
			t.Errorf("fast decoder took %q: %v, want %v", tc.body, took, tc.take)
		}
	}
}
