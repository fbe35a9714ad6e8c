package extract

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/go-json-experiment/json/jsontext"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/cartrouter/cart/dataplane/apierr"
)

// Shorthands for the structure bytes, so expected keys read like the
// grammar in the package documentation.
const (
	RS  = "\x1e"
	US  = "\x1f"
	GS  = "\x1d"
	NUL = "\x00"
	STX = "\x02"
	ETX = "\x03"
)

// hashRE matches a hashed marker's payload.
const hashRE = `[0-9a-f]{16}`

func mustExtract(t *testing.T, e Endpoint, body string) *Request {
	t.Helper()
	r, err := Extract(e, []byte(body))
	if err != nil {
		t.Fatalf("Extract(%s, %s): %v", e, body, err)
	}
	return r
}

func key(t *testing.T, e Endpoint, body string) string {
	t.Helper()
	return string(mustExtract(t, e, body).Key)
}

// keyCase is one body and the key it must give: exact, or a regexp when
// want starts with "re:".
type keyCase struct{ name, body, want string }

func checkKeys(t *testing.T, e Endpoint, cases []keyCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := key(t, e, tc.body)
			if re, ok := strings.CutPrefix(tc.want, "re:"); ok {
				if !regexp.MustCompile(re).MatchString(got) {
					t.Errorf("key %q does not match %q", got, re)
				}
				return
			}
			if got != tc.want {
				t.Errorf("key\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestEndpointForPath(t *testing.T) {
	for _, tc := range []struct {
		path string
		want Endpoint
		ok   bool
		name string
	}{
		{"/v1/chat/completions", ChatCompletions, true, "chat_completions"},
		{"/v1/completions", Completions, true, "completions"},
		{"/v1/messages", Messages, true, "messages"},
		{"/v1/chat/completions/", 0, false, "unknown"},
		{"/v1/models", 0, false, "unknown"},
		{"", 0, false, "unknown"},
	} {
		got, ok := EndpointForPath(tc.path)
		if got != tc.want || ok != tc.ok {
			t.Errorf("EndpointForPath(%q) = %v, %v; want %v, %v", tc.path, got, ok, tc.want, tc.ok)
		}
		if got.String() != tc.name {
			t.Errorf("%q: String() = %q, want %q", tc.path, got.String(), tc.name)
		}
	}
}

func TestRequestFields(t *testing.T) {
	for _, tc := range []struct {
		name string
		e    Endpoint
		body string
		want Request
	}{
		{
			"chat all fields", ChatCompletions,
			`{"model":"m1","stream":true,"stream_options":{"include_usage":true},"user":"u1","prompt_cache_key":"pk","messages":[{"role":"user","content":"hi"}]}`,
			Request{Model: "m1", Stream: true, IncludeUsage: true, User: "u1", PromptCacheKey: "pk"},
		},
		{
			"chat nulls", ChatCompletions,
			`{"model":null,"stream":null,"stream_options":null,"user":null,"messages":[{"role":"user","content":"hi"}]}`,
			Request{},
		},
		{
			"chat no model", ChatCompletions,
			`{"messages":[{"role":"user","content":"hi"}]}`,
			Request{},
		},
		{
			"completions", Completions,
			`{"model":"m2","stream":true,"stream_options":{"include_usage":false},"user":"u2","prompt_cache_key":"pk2","prompt":"x"}`,
			Request{Model: "m2", Stream: true, User: "u2", PromptCacheKey: "pk2"},
		},
		{
			"messages", Messages,
			`{"model":"claude","stream":true,"max_tokens":10,"metadata":{"user_id":"u3"},"messages":[{"role":"user","content":"hi"}]}`,
			Request{Model: "claude", Stream: true, User: "u3"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := mustExtract(t, tc.e, tc.body)
			got.Key = nil
			if fmt.Sprint(*got) != fmt.Sprint(tc.want) {
				t.Errorf("got %+v, want %+v", *got, tc.want)
			}
		})
	}
}

func TestChatKey(t *testing.T) {
	checkKeys(t, ChatCompletions, []keyCase{
		{"string content",
			`{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]}`,
			"system" + US + "Be brief." + RS + "user" + US + "Hi" + RS},
		{"text parts",
			`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`,
			"user" + US + "a" + US + "b" + RS},
		{"input_text and output_text",
			`{"messages":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"output_text","text":"b"}]}]}`,
			"user" + US + "a" + US + "b" + RS},
		{"bare string part",
			`{"messages":[{"role":"user","content":["a",{"type":"text","text":"b"}]}]}`,
			"user" + US + "a" + US + "b" + RS},
		{"text null counts as empty",
			`{"messages":[{"role":"user","content":[{"type":"text","text":null}]}]}`,
			"user" + US + RS},
		{"empty content array",
			`{"messages":[{"role":"user","content":[]}]}`,
			"user" + RS},
		{"json escapes decoded",
			`{"messages":[{"role":"user","content":"line\nnext \"q\" \u00e9 \ud83d\ude00 \/"}]}`,
			"user" + US + "line\nnext \"q\" é 😀 /" + RS},
		{"lone surrogate",
			`{"messages":[{"role":"user","content":"\ud800x"}]}`,
			"user" + US + "\uFFFDx" + RS},
		{"control bytes escaped",
			`{"messages":[{"role":"user","content":"a\u001eb\u001fc\u0000d\u001be\t"}]}`,
			"user" + US + "a\x1b^b\x1b_c\x1b@d\x1b[e\t" + RS},
		{"name and tool_call_id",
			`{"messages":[{"role":"user","name":"bob","content":"hi"},{"role":"tool","tool_call_id":"call_1","content":"42"}]}`,
			"user" + US + NUL + "name:bob" + US + "hi" + RS + "tool" + US + NUL + "call_id:call_1" + US + "42" + RS},
		{"tool calls with null content",
			`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get","arguments":"{\"city\": \"Paris\"}"}},{"id":"c2","type":"function","function":{"name":"put","arguments":"{}"}}]}]}`,
			"assistant" + US + NUL + "tool_call:c1" + GS + "get" + GS + `{"city": "Paris"}` + US + NUL + "tool_call:c2" + GS + "put" + GS + "{}" + RS},
		{"tool call arguments as object are compacted",
			`{"messages":[{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"get","arguments":{ "city" : "Paris" }}}]}]}`,
			"assistant" + US + NUL + "tool_call:c1" + GS + "get" + GS + `{"city":"Paris"}` + RS},
		{"custom tool call",
			`{"messages":[{"role":"assistant","content":"ok","tool_calls":[{"id":"c1","type":"custom","custom":{"name":"sql","input":"SELECT 1"}}]}]}`,
			"assistant" + US + "ok" + US + NUL + "tool_call:c1" + GS + "sql" + GS + "SELECT 1" + RS},
		{"unknown tool call type",
			`{"messages":[{"role":"assistant","tool_calls":[{"id":"c1","type":"mcp"}]}]}`,
			"assistant" + US + NUL + "tool_call:c1" + GS + "mcp" + RS},
		{"legacy function_call",
			`{"messages":[{"role":"assistant","content":null,"function_call":{"name":"f","arguments":"{}"}},{"role":"function","name":"f","content":"r"}]}`,
			"assistant" + US + NUL + "fn_call:f" + GS + "{}" + RS + "function" + US + NUL + "name:f" + US + "r" + RS},
		{"refusal and thinking",
			`{"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"hmm"},{"type":"refusal","refusal":"no"}]}]}`,
			"assistant" + US + NUL + "think:hmm" + US + NUL + "refusal:no" + RS},
		{"generation parameters ignored",
			`{"model":"m","temperature":0.2,"max_tokens":5,"stream":true,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"auto","n":2,"messages":[{"role":"user","content":"Hi"}]}`,
			"user" + US + "Hi" + RS},
		{"image_url object",
			`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA","detail":"high"}}]}]}`,
			"re:^user" + US + NUL + "img:" + hashRE + RS + "$"},
		{"image_url string (vLLM)",
			`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":"data:image/png;base64,AAAA"}]}]}`,
			"re:^user" + US + NUL + "img:" + hashRE + RS + "$"},
		{"untyped image_url (vLLM)",
			`{"messages":[{"role":"user","content":[{"image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`,
			"re:^user" + US + NUL + "img:" + hashRE + RS + "$"},
		{"input_image",
			`{"messages":[{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,AAAA"},{"type":"input_image","file_id":"file-1"}]}]}`,
			"re:^user" + US + NUL + "img:" + hashRE + US + NUL + "img:" + hashRE + RS + "$"},
		{"input_audio",
			`{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"UklGR","format":"wav"}}]}]}`,
			"re:^user" + US + NUL + "audio:" + hashRE + RS + "$"},
		{"audio_url and video_url",
			`{"messages":[{"role":"user","content":[{"type":"audio_url","audio_url":{"url":"data:audio/wav;base64,AA"}},{"type":"video_url","video_url":{"url":"data:video/mp4;base64,AA"}}]}]}`,
			"re:^user" + US + NUL + "audio:" + hashRE + US + NUL + "video:" + hashRE + RS + "$"},
		{"file",
			`{"messages":[{"role":"user","content":[{"type":"file","file":{"file_data":"data:application/pdf;base64,JVBER","filename":"a.pdf"}},{"type":"file","file":{"file_id":"file-abc"}}]}]}`,
			"re:^user" + US + NUL + "file:" + hashRE + US + NUL + "file:" + hashRE + RS + "$"},
		{"media with uuid only",
			`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":null,"uuid":"img-1"}]}]}`,
			"re:^user" + US + NUL + "img:" + hashRE + RS + "$"},
		{"unknown part type",
			`{"messages":[{"role":"user","content":[{"type":"image_embeds","image_embeds":"AAAA"},{"type":"text","text":"x"}]}]}`,
			"re:^user" + US + NUL + "part:image_embeds:" + hashRE + US + "x" + RS + "$"},
		{"unknown part type with clashing fields",
			`{"messages":[{"type":"x","role":"user","content":[{"type":"future","text":{"rich":true},"image_url":5}]}]}`,
			"re:^user" + US + NUL + "part:future:" + hashRE + RS + "$"},
	})
}

func TestMessagesKey(t *testing.T) {
	checkKeys(t, Messages, []keyCase{
		{"system string",
			`{"model":"c","max_tokens":9,"system":"Be brief.","messages":[{"role":"user","content":"Hi"}]}`,
			"system" + US + "Be brief." + RS + "user" + US + "Hi" + RS},
		{"system blocks",
			`{"system":[{"type":"text","text":"a","cache_control":{"type":"ephemeral"}},{"type":"text","text":"b"}],"messages":[{"role":"user","content":"Hi"}]}`,
			"system" + US + "a" + US + "b" + RS + "user" + US + "Hi" + RS},
		{"no system",
			`{"messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]},{"role":"assistant","content":"Yo"}]}`,
			"user" + US + "Hi" + RS + "assistant" + US + "Yo" + RS},
		{"tool use and result",
			`{"messages":[{"role":"assistant","content":[{"type":"text","text":"Checking."},{"type":"tool_use","id":"tu1","name":"get","input":{ "city": "Paris" }}]},` +
				`{"role":"user","content":[{"type":"tool_result","tool_use_id":"tu1","content":"18C"},{"type":"tool_result","tool_use_id":"tu2","is_error":true,"content":[{"type":"text","text":"boom"}]},{"type":"tool_result","tool_use_id":"tu3"}]}]}`,
			"assistant" + US + "Checking." + US + NUL + "tool_use:tu1" + GS + "get" + GS + `{"city":"Paris"}` + RS +
				"user" + US + NUL + "tool_result:tu1" + STX + US + "18C" + ETX +
				US + NUL + "tool_result:tu2" + GS + "error" + STX + US + "boom" + ETX +
				US + NUL + "tool_result:tu3" + STX + ETX + RS},
		{"thinking",
			`{"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"sig"},{"type":"redacted_thinking","data":"xyz"},{"type":"text","text":"ok"}]}]}`,
			"re:^assistant" + US + NUL + "think:hmm" + US + NUL + "redacted_think:" + hashRE + US + "ok" + RS + "$"},
		{"images",
			`{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}},{"type":"image","source":{"type":"url","url":"https://x/a.png"}},{"type":"image","source":{"type":"file","file_id":"f1"}}]}]}`,
			"re:^user" + US + NUL + "img:" + hashRE + US + NUL + "img:" + hashRE + US + NUL + "img:" + hashRE + RS + "$"},
		{"documents",
			`{"messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBER"}},{"type":"document","source":{"type":"text","media_type":"text/plain","data":"plain"}},{"type":"document","source":{"type":"content","content":[{"type":"text","text":"inner"}]}}]}]}`,
			"re:^user" + US + NUL + "doc:" + hashRE + US + NUL + "doc:" + hashRE + US + NUL + "doc:" + STX + US + "inner" + ETX + RS + "$"},
		{"image inside tool result",
			`{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}}]}]}]}`,
			"re:^user" + US + NUL + "tool_result:t" + STX + US + NUL + "img:" + hashRE + ETX + RS + "$"},
		{"unknown block and source types",
			`{"messages":[{"role":"assistant","content":[{"type":"server_tool_use","id":"s1","name":"web_search","input":{"q":"x"}},{"type":"image","source":{"type":"s3","bucket":"b"}}]}]}`,
			"re:^assistant" + US + NUL + "part:server_tool_use:" + hashRE + US + NUL + "img:" + hashRE + RS + "$"},
	})
}

func TestCompletionsKey(t *testing.T) {
	checkKeys(t, Completions, []keyCase{
		{"string", `{"model":"m","prompt":"Once upon a time","max_tokens":5}`, "Once upon a time"},
		{"empty string", `{"prompt":""}`, ""},
		{"escapes", `{"prompt":"a\nb\u0003"}`, "a\nb\x1bC"},
		{"array of strings", `{"prompt":["a","b", "c"]}`, "a" + RS + "b" + RS + "c"},
		{"single string in array", `{"prompt":["a"]}`, "a"},
		{"token ids", `{"prompt":[1, 22,333 ,0]}`, "1" + US + "22" + US + "333" + US + "0" + US},
		{"arrays of token ids", `{"prompt":[[1,2],[3],[]]}`, "1" + US + "2" + US + RS + "3" + US + RS},
		{"empty array", `{"prompt":[]}`, ""},
		{"whitespace", "{\"prompt\": [ [ 1 ,\n2 ] , [3] ] }", "1" + US + "2" + US + RS + "3" + US},
	})
	// Token ids and the same digits as text must not share a key.
	if key(t, Completions, `{"prompt":[1,2]}`) == key(t, Completions, `{"prompt":"1\u001f2\u001f"}`) {
		t.Error("token ids and text collide")
	}
	if got := key(t, Completions, `{"prompt_embeds":"AAAA"}`); !regexp.MustCompile("^" + US + NUL + "embeds:" + hashRE + "$").MatchString(got) {
		t.Errorf("prompt_embeds key %q", got)
	}
}

// TestEquivalentForms checks that different spellings of the same prompt
// give the same key, so that clients do not split the cache between them.
func TestEquivalentForms(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b string
		ea   Endpoint
		eb   Endpoint
	}{
		{"string content vs text part",
			`{"messages":[{"role":"user","content":"hi"}]}`,
			`{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`,
			ChatCompletions, ChatCompletions},
		{"json escapes",
			`{"messages":[{"role":"user","content":"a/b é"}]}`,
			`{"messages":[{"role":"user","content":"a\/b \u00e9"}]}`,
			ChatCompletions, ChatCompletions},
		{"escaped image url",
			`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AB/CD"}}]}]}`,
			`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image\/png;base64,AB\/CD"}}]}]}`,
			ChatCompletions, ChatCompletions},
		{"image_url string vs object",
			`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":"data:x"}]}]}`,
			`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:x","detail":"low"}}]}]}`,
			ChatCompletions, ChatCompletions},
		{"key order and cache_control",
			`{"messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}],"model":"m"}`,
			`{"model":"m","messages":[{"content":"hi","role":"user"}]}`,
			Messages, Messages},
		{"unknown block: cache_control and key order",
			`{"messages":[{"role":"user","content":[{"type":"search_result","source":"s","title":"t","cache_control":{"type":"ephemeral"}}]}]}`,
			`{"messages":[{"role":"user","content":[{"title":"t","type":"search_result","source":"s"}]}]}`,
			Messages, Messages},
		{"anthropic vs chat",
			`{"system":"sys","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"yo"}]}]}`,
			`{"messages":[{"role":"system","content":"sys"},{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}]}`,
			Messages, ChatCompletions},
		{"prompt string vs one-element array",
			`{"prompt":"x"}`, `{"prompt":["x"]}`, Completions, Completions},
		{"token ids flat vs nested",
			`{"prompt":[1,2]}`, `{"prompt":[[1,2]]}`, Completions, Completions},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ka, kb := key(t, tc.ea, tc.a), key(t, tc.eb, tc.b)
			if ka != kb {
				t.Errorf("keys differ:\n%q\n%q", ka, kb)
			}
		})
	}
}

// TestDistinctForms checks that prompts the model sees differently never
// share a key.
func TestDistinctForms(t *testing.T) {
	img := func(url string) string {
		return `{"messages":[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"` + url + `"}}]}]}`
	}
	anthImg := func(data string) string {
		return `{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + data + `"}}]}]}`
	}
	for _, tc := range []struct {
		name string
		e    Endpoint
		a, b string
	}{
		{"different images", ChatCompletions, img("data:image/png;base64,AAAA"), img("data:image/png;base64,AAAB")},
		{"different anthropic images", Messages, anthImg("AAAA"), anthImg("AAAB")},
		{"text vs image with the same bytes", ChatCompletions,
			`{"messages":[{"role":"user","content":[{"type":"text","text":"data:image/png;base64,AAAA"}]}]}`,
			`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`},
		{"image vs audio with the same bytes", ChatCompletions,
			`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:x"}}]}]}`,
			`{"messages":[{"role":"user","content":[{"type":"audio_url","audio_url":{"url":"data:x"}}]}]}`},
		{"audio formats", ChatCompletions,
			`{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AA","format":"wav"}}]}]}`,
			`{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AA","format":"mp3"}}]}]}`},
		{"uuid vs url", ChatCompletions,
			`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:x"}}]}]}`,
			`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:x"},"uuid":"u1"}]}]}`},
		{"one message vs two", ChatCompletions,
			`{"messages":[{"role":"user","content":"a\u001euser\u001fb"}]}`,
			`{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}`},
		{"two parts vs one", ChatCompletions,
			`{"messages":[{"role":"user","content":["a","b"]}]}`,
			`{"messages":[{"role":"user","content":"a\u001fb"}]}`},
		{"role vs content", ChatCompletions,
			`{"messages":[{"role":"user\u001fx","content":"y"}]}`,
			`{"messages":[{"role":"user","content":"x\u001fy"}]}`},
		{"tool error flag", Messages,
			`{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"x"}]}]}`,
			`{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","is_error":true,"content":"x"}]}]}`},
		{"tool arguments", ChatCompletions,
			`{"messages":[{"role":"assistant","tool_calls":[{"id":"1","function":{"name":"f","arguments":"{\"a\":1}"}}]}]}`,
			`{"messages":[{"role":"assistant","tool_calls":[{"id":"1","function":{"name":"f","arguments":"{\"a\":2}"}}]}]}`},
		{"unknown part contents", ChatCompletions,
			`{"messages":[{"role":"user","content":[{"type":"x","v":1}]}]}`,
			`{"messages":[{"role":"user","content":[{"type":"x","v":2}]}]}`},
		{"prompt batch vs text", Completions, `{"prompt":["a","b"]}`, `{"prompt":"a\u001eb"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if ka, kb := key(t, tc.e, tc.a), key(t, tc.e, tc.b); ka == kb {
				t.Errorf("same key %q", ka)
			}
		})
	}
	// And the same image twice gives the same key.
	// (Two separate extractions of two separately built bodies.)
	first, second := img("data:image/png;base64,AAAA"), img("data:image/png;base64,AAAA")
	if key(t, ChatCompletions, first) != key(t, ChatCompletions, second) {
		t.Error("same image, different keys")
	}
}

func TestRemoteMediaURL(t *testing.T) {
	chat := func(part string) string {
		return `{"messages":[{"role":"user","content":[{"type":"text","text":"http://not-media.example"},` + part + `]}]}`
	}
	anth := func(block string) string {
		return `{"messages":[{"role":"user","content":[` + block + `]}]}`
	}
	for _, tc := range []struct {
		name string
		e    Endpoint
		body string
		want string
	}{
		{"http image_url", ChatCompletions, chat(`{"type":"image_url","image_url":{"url":"http://a.example/x.png"}}`), "http://a.example/x.png"},
		{"HTTPS uppercase", ChatCompletions, chat(`{"type":"image_url","image_url":{"url":"HTTPS://A.example/x.png"}}`), "HTTPS://A.example/x.png"},
		{"escaped slashes", ChatCompletions, chat(`{"type":"image_url","image_url":{"url":"https:\/\/a.example\/x.png"}}`), "https://a.example/x.png"},
		{"leading space and tab in scheme", ChatCompletions, chat(`{"type":"image_url","image_url":{"url":" \u0001ht\ttps://a.example/"}}`), " \x01ht\ttps://a.example/"},
		{"data url is not remote", ChatCompletions, chat(`{"type":"image_url","image_url":{"url":"data:image/png;base64,aHR0cDovLw=="}}`), ""},
		{"file scheme is not remote", ChatCompletions, chat(`{"type":"image_url","image_url":{"url":"file:///etc/passwd"}}`), ""},
		{"other scheme", ChatCompletions, chat(`{"type":"image_url","image_url":{"url":"s3://b/k"}}`), ""},
		{"httpx scheme", ChatCompletions, chat(`{"type":"image_url","image_url":{"url":"httpx://a"}}`), "httpx://a"},
		{"image_url string", ChatCompletions, chat(`{"type":"image_url","image_url":"https://a/b.png"}`), "https://a/b.png"},
		{"input_image", ChatCompletions, chat(`{"type":"input_image","image_url":"https://a/b.png"}`), "https://a/b.png"},
		{"audio_url", ChatCompletions, chat(`{"type":"audio_url","audio_url":{"url":"https://a/b.wav"}}`), "https://a/b.wav"},
		{"video_url", ChatCompletions, chat(`{"type":"video_url","video_url":{"url":"https://a/b.mp4"}}`), "https://a/b.mp4"},
		{"file url variants", ChatCompletions, chat(`{"type":"file","file":{"file_url":"https://a/b.pdf"}}`), "https://a/b.pdf"},
		{"file_data url", ChatCompletions, chat(`{"type":"file","file":{"file_data":"https://a/c.pdf"}}`), "https://a/c.pdf"},
		{"file_id url", ChatCompletions, chat(`{"type":"file","file":{"file_id":"https://a/d.pdf"}}`), "https://a/d.pdf"},
		{"uuid part with url", ChatCompletions, chat(`{"type":"image_url","image_url":{"url":"https://a/u.png"},"uuid":"u"}`), "https://a/u.png"},
		{"media field under another type", ChatCompletions, chat(`{"type":"text","text":"x","uuid":"u","video_url":{"url":"https://a/v.mp4"}}`), "https://a/v.mp4"},
		{"first of several", ChatCompletions, chat(`{"type":"image_url","image_url":{"url":"https://a/1.png"}},{"type":"image_url","image_url":{"url":"https://a/2.png"}}`), "https://a/1.png"},
		{"anthropic image url", Messages, anth(`{"type":"image","source":{"type":"url","url":"https://a/i.png"}}`), "https://a/i.png"},
		{"anthropic document url", Messages, anth(`{"type":"document","source":{"type":"url","url":"http://a/d.pdf"}}`), "http://a/d.pdf"},
		{"anthropic base64 is not remote", Messages, anth(`{"type":"image","source":{"type":"base64","media_type":"image/png","data":"https://x"}}`), ""},
		{"anthropic nested in tool result", Messages, anth(`{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{"type":"url","url":"https://a/t.png"}}]}`), "https://a/t.png"},
		{"anthropic unknown source type", Messages, anth(`{"type":"image","source":{"type":"remote","url":"https://a/r.png"}}`), "https://a/r.png"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := mustExtract(t, tc.e, tc.body).RemoteMediaURL; got != tc.want {
				t.Errorf("RemoteMediaURL = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	msgs := func(m string) string { return `{"messages":[` + m + `]}` }
	userParts := func(p string) string { return msgs(`{"role":"user","content":[` + p + `]}`) }
	anth := func(b string) string { return msgs(`{"role":"user","content":[` + b + `]}`) }
	for _, tc := range []struct {
		name  string
		e     Endpoint
		body  string
		param string
		code  string
	}{
		{"empty body", ChatCompletions, "", "", codeInvalidJSON},
		{"whitespace body", ChatCompletions, " \n", "", codeInvalidJSON},
		{"null body", ChatCompletions, "null", "", codeInvalidJSON},
		{"array body", Completions, "[]", "", codeInvalidJSON},
		{"string body", Messages, `"x"`, "", codeInvalidJSON},
		{"malformed", ChatCompletions, `{"messages":[}`, "", codeInvalidJSON},
		{"truncated", ChatCompletions, `{"messages":[{"role":"user","content":"hi"}]`, "", codeInvalidJSON},
		{"trailing garbage", ChatCompletions, `{"messages":[{"role":"user","content":"hi"}]} x`, "", codeInvalidJSON},
		{"too deep", ChatCompletions, `{"x":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`, "", codeInvalidJSON},

		{"model type", ChatCompletions, `{"model":1,"messages":[{"role":"user","content":"x"}]}`, "model", codeInvalidType},
		{"stream type", ChatCompletions, `{"stream":"yes","messages":[{"role":"user","content":"x"}]}`, "stream", codeInvalidType},
		{"include_usage type", ChatCompletions, `{"stream_options":{"include_usage":1},"messages":[{"role":"user","content":"x"}]}`, "stream_options.include_usage", codeInvalidType},
		{"stream_options type", Completions, `{"stream_options":true,"prompt":"x"}`, "stream_options", codeInvalidType},
		{"user type", ChatCompletions, `{"user":{},"messages":[{"role":"user","content":"x"}]}`, "user", codeInvalidType},
		{"prompt_cache_key type", ChatCompletions, `{"prompt_cache_key":[],"messages":[{"role":"user","content":"x"}]}`, "prompt_cache_key", codeInvalidType},
		{"messages missing", ChatCompletions, `{"model":"m"}`, "messages", codeMissingParam},
		{"messages null", ChatCompletions, `{"messages":null}`, "messages", codeMissingParam},
		{"messages empty", ChatCompletions, `{"messages":[]}`, "messages", codeInvalidValue},
		{"messages type", ChatCompletions, `{"messages":{"role":"user"}}`, "messages", codeInvalidType},
		{"message type", ChatCompletions, msgs(`{"role":"user","content":"x"},"hi"`), "messages[1]", codeInvalidType},
		{"message array", ChatCompletions, msgs(`[1]`), "messages[0]", codeInvalidType},
		{"tool call array", ChatCompletions, msgs(`{"role":"assistant","tool_calls":[[1]]}`), "messages[0].tool_calls[0]", codeInvalidType},
		{"role missing", ChatCompletions, msgs(`{"role":"user","content":"x"},{"role":"user","content":"x"},{"content":"x"}`), "messages[2].role", codeMissingParam},
		{"role type", ChatCompletions, msgs(`{"role":"user","content":"x"},{"role":5,"content":"x"}`), "messages[1].role", codeInvalidType},
		{"name type", ChatCompletions, msgs(`{"role":"user","name":5,"content":"x"}`), "messages[0].name", codeInvalidType},
		{"content missing for user", ChatCompletions, msgs(`{"role":"user"}`), "messages[0].content", codeMissingParam},
		{"content null for tool", ChatCompletions, msgs(`{"role":"tool","content":null}`), "messages[0].content", codeMissingParam},
		{"content type", ChatCompletions, msgs(`{"role":"user","content":"x"},{"role":"user","content":"x"},{"role":"user","content":42}`), "messages[2].content", codeInvalidType},
		{"content object", ChatCompletions, msgs(`{"role":"user","content":{"type":"text"}}`), "messages[0].content", codeInvalidType},
		{"tool_calls type", ChatCompletions, msgs(`{"role":"assistant","tool_calls":{}}`), "messages[0].tool_calls", codeInvalidType},
		{"tool call name type", ChatCompletions, msgs(`{"role":"assistant","tool_calls":[{"id":"a","function":{"name":"f"}},{"id":"b","function":{"name":[1]}}]}`), "messages[0].tool_calls[1].function.name", codeInvalidType},
		{"tool call arguments type", ChatCompletions, msgs(`{"role":"assistant","tool_calls":[{"id":"a","function":{"name":"f","arguments":12}}]}`), "messages[0].tool_calls[0].function.arguments", codeInvalidType},
		{"part type", ChatCompletions, userParts(`{"type":"text","text":"a"},12`), "messages[0].content[1]", codeInvalidType},
		{"part type missing", ChatCompletions, userParts(`{"text":"a"}`), "messages[0].content[0].type", codeMissingParam},
		{"part type not string", ChatCompletions, userParts(`{"type":1,"text":"a"}`), "messages[0].content[0].type", codeInvalidType},
		{"text type", ChatCompletions, userParts(`{"type":"text","text":"a"},{"type":"text","text":["a"]}`), "messages[0].content[1].text", codeInvalidType},
		{"refusal type", ChatCompletions, userParts(`{"type":"refusal","refusal":1}`), "messages[0].content[0].refusal", codeInvalidType},
		{"image_url missing", ChatCompletions, userParts(`{"type":"image_url"}`), "messages[0].content[0].image_url", codeMissingParam},
		{"image_url url missing", ChatCompletions, userParts(`{"type":"image_url","image_url":{"detail":"low"}}`), "messages[0].content[0].image_url.url", codeMissingParam},
		{"image_url url type", ChatCompletions, userParts(`{"type":"image_url","image_url":{"url":1}}`), "messages[0].content[0].image_url.url", codeInvalidType},
		{"image_url type", ChatCompletions, userParts(`{"type":"image_url","image_url":1}`), "messages[0].content[0].image_url", codeInvalidType},
		{"input_audio data missing", ChatCompletions, userParts(`{"type":"input_audio","input_audio":{"format":"wav"}}`), "messages[0].content[0].input_audio.data", codeMissingParam},
		{"input_audio data type", ChatCompletions, userParts(`{"type":"input_audio","input_audio":{"data":1,"format":"wav"}}`), "messages[0].content[0].input_audio.data", codeInvalidType},
		{"input_audio format type", ChatCompletions, userParts(`{"type":"input_audio","input_audio":{"data":"A","format":1}}`), "messages[0].content[0].input_audio.format", codeInvalidType},
		{"file missing", ChatCompletions, userParts(`{"type":"file"}`), "messages[0].content[0].file", codeMissingParam},
		{"file empty", ChatCompletions, userParts(`{"type":"file","file":{"filename":"a"}}`), "messages[0].content[0].file.file_data", codeMissingParam},
		{"file_data type", ChatCompletions, userParts(`{"type":"file","file":{"file_data":1}}`), "messages[0].content[0].file.file_data", codeInvalidType},

		{"anthropic messages missing", Messages, `{"model":"c","max_tokens":1}`, "messages", codeMissingParam},
		{"anthropic content missing", Messages, msgs(`{"role":"user"}`), "messages[0].content", codeMissingParam},
		{"anthropic content null for assistant", Messages, msgs(`{"role":"assistant","content":null}`), "messages[0].content", codeMissingParam},
		{"anthropic content type", Messages, msgs(`{"role":"user","content":1}`), "messages[0].content", codeInvalidType},
		{"anthropic role type", Messages, msgs(`{"role":["user"],"content":"x"}`), "messages[0].role", codeInvalidType},
		{"anthropic metadata user_id type", Messages, `{"metadata":{"user_id":1},"messages":[{"role":"user","content":"x"}]}`, "metadata.user_id", codeInvalidType},
		{"system type", Messages, `{"system":1,"messages":[{"role":"user","content":"x"}]}`, "system", codeInvalidType},
		{"system block type", Messages, `{"system":[{"type":"text","text":"a"},{"type":"image","text":"b"}],"messages":[{"role":"user","content":"x"}]}`, "system[1].type", codeInvalidValue},
		{"system block text type", Messages, `{"system":[{"type":"text","text":1}],"messages":[{"role":"user","content":"x"}]}`, "system[0].text", codeInvalidType},
		{"system block text missing", Messages, `{"system":[{"type":"text"}],"messages":[{"role":"user","content":"x"}]}`, "system[0].text", codeMissingParam},
		{"system block not object", Messages, `{"system":["a"],"messages":[{"role":"user","content":"x"}]}`, "system[0]", codeInvalidType},
		{"block not object", Messages, anth(`"hi"`), "messages[0].content[0]", codeInvalidType},
		{"block type missing", Messages, anth(`{"text":"hi"}`), "messages[0].content[0].type", codeMissingParam},
		{"block text type", Messages, anth(`{"type":"text","text":"a"},{"type":"text","text":{}}`), "messages[0].content[1].text", codeInvalidType},
		{"block text missing", Messages, anth(`{"type":"text"}`), "messages[0].content[0].text", codeMissingParam},
		{"image source missing", Messages, anth(`{"type":"image"}`), "messages[0].content[0].source", codeMissingParam},
		{"image source type", Messages, anth(`{"type":"image","source":"x"}`), "messages[0].content[0].source", codeInvalidType},
		{"image data missing", Messages, anth(`{"type":"image","source":{"type":"base64","media_type":"image/png"}}`), "messages[0].content[0].source.data", codeMissingParam},
		{"image data type", Messages, anth(`{"type":"image","source":{"type":"base64","data":7}}`), "messages[0].content[0].source.data", codeInvalidType},
		{"image url missing", Messages, anth(`{"type":"image","source":{"type":"url"}}`), "messages[0].content[0].source.url", codeMissingParam},
		{"image file_id missing", Messages, anth(`{"type":"image","source":{"type":"file"}}`), "messages[0].content[0].source.file_id", codeMissingParam},
		{"tool_use id type", Messages, anth(`{"type":"tool_use","id":1,"name":"f","input":{}}`), "messages[0].content[0].id", codeInvalidType},
		{"tool_result content type", Messages, anth(`{"type":"tool_result","tool_use_id":"t","content":5}`), "messages[0].content[0].content", codeInvalidType},
		{"tool_result nested error", Messages, anth(`{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"a"},{"type":"image","source":{"type":"url","url":false}}]}`), "messages[0].content[0].content[1].source.url", codeInvalidType},
		{"tool_result is_error type", Messages, anth(`{"type":"tool_result","tool_use_id":"t","is_error":"yes"}`), "messages[0].content[0].is_error", codeInvalidType},
		{"thinking type", Messages, anth(`{"type":"thinking","thinking":1}`), "messages[0].content[0].thinking", codeInvalidType},
		{"document content missing", Messages, anth(`{"type":"document","source":{"type":"content"}}`), "messages[0].content[0].source.content", codeMissingParam},
		{"nesting too deep", Messages, anth(strings.Repeat(`{"type":"tool_result","tool_use_id":"t","content":[`, 12) + `{"type":"text","text":"x"}` + strings.Repeat(`]}`, 12)),
			"messages[0]" + strings.Repeat(".content[0]", 9) + ".content", codeInvalidValue},

		{"prompt missing", Completions, `{"model":"m"}`, "prompt", codeMissingParam},
		{"prompt null", Completions, `{"prompt":null}`, "prompt", codeMissingParam},
		{"prompt type", Completions, `{"prompt":{"text":"x"}}`, "prompt", codeInvalidType},
		{"prompt bool", Completions, `{"prompt":true}`, "prompt", codeInvalidType},
		{"prompt mixed strings", Completions, `{"prompt":["a",1]}`, "prompt[1]", codeInvalidType},
		{"prompt mixed ids", Completions, `{"prompt":[1,"a"]}`, "prompt[1]", codeInvalidType},
		{"prompt float id", Completions, `{"prompt":[1,2.5]}`, "prompt[1]", codeInvalidValue},
		{"prompt exponent id", Completions, `{"prompt":[1e3]}`, "prompt[0]", codeInvalidValue},
		{"prompt object element", Completions, `{"prompt":[{}]}`, "prompt[0]", codeInvalidType},
		{"prompt nested mixed", Completions, `{"prompt":[[1],2]}`, "prompt[1]", codeInvalidType},
		{"prompt nested bad id", Completions, `{"prompt":[[1],[2,null]]}`, "prompt[1][1]", codeInvalidType},
		{"prompt nested deeper", Completions, `{"prompt":[[[1]]]}`, "prompt[0][0]", codeInvalidType},
		{"completions model type", Completions, `{"model":true,"prompt":"x"}`, "model", codeInvalidType},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Extract(tc.e, []byte(tc.body))
			var ae *apierr.Error
			if !errors.As(err, &ae) {
				t.Fatalf("error %v (%T), want *apierr.Error", err, err)
			}
			if ae.Status != http.StatusBadRequest || ae.Type != apierr.TypeInvalidRequest {
				t.Errorf("status %d type %q, want 400 %q", ae.Status, ae.Type, apierr.TypeInvalidRequest)
			}
			if ae.Param != tc.param || ae.Code != tc.code {
				t.Errorf("param %q code %q, want %q %q (%s)", ae.Param, ae.Code, tc.param, tc.code, ae.Message)
			}
			if tc.param != "" && !strings.Contains(ae.Message, "'"+tc.param+"'") {
				t.Errorf("message %q does not name %q", ae.Message, tc.param)
			}
		})
	}
}

func TestErrorMessages(t *testing.T) {
	for _, tc := range []struct {
		e    Endpoint
		body string
		want string
	}{
		{ChatCompletions, `{"messages":[{"role":"user","content":42}]}`,
			"Invalid type for 'messages[0].content': expected a string or an array of content parts, but got a number instead."},
		{ChatCompletions, `{"messages":[{"role":5}]}`,
			"Invalid type for 'messages[0].role': expected a string, but got a number instead."},
		{ChatCompletions, `{"messages":[{"role":"user","content":[{"type":"text","text":true}]}]}`,
			"Invalid type for 'messages[0].content[0].text': expected a string, but got a boolean instead."},
		{ChatCompletions, `{"stream":"no","messages":[{"role":"user","content":"x"}]}`,
			"Invalid type for 'stream': expected a boolean, but got a string instead."},
		{ChatCompletions, `{"messages":[{"content":"x"}]}`,
			"Missing required parameter: 'messages[0].role'."},
		{Completions, `{}`, "Missing required parameter: 'prompt'."},
		{ChatCompletions, ``, "The request body is empty; expected a JSON object."},
	} {
		_, err := Extract(tc.e, []byte(tc.body))
		var ae *apierr.Error
		if !errors.As(err, &ae) || ae.Message != tc.want {
			t.Errorf("%s: got %v, want message %q", tc.body, err, tc.want)
		}
	}
}

func TestUnknownEndpoint(t *testing.T) {
	_, err := Extract(Endpoint(0), []byte(`{}`))
	var ae *apierr.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusInternalServerError {
		t.Fatalf("got %v, want a 500 *apierr.Error", err)
	}
}

// conversation is a multi-turn chat with every kind of message, used by the
// prefix property tests.
var conversation = []string{
	`{"role":"system","content":"You are terse."}`,
	`{"role":"user","name":"ann","content":[{"type":"text","text":"What is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]}`,
	`{"role":"assistant","content":"A cat.\n"}`,
	`{"role":"user","content":"Weather in Paris?"}`,
	`{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Paris\"}"}}]}`,
	`{"role":"tool","tool_call_id":"call_1","content":"18C"}`,
	`{"role":"assistant","content":[{"type":"text","text":"18C."}]}`,
	`{"role":"user","content":"\u0000\u001e odd \u001f bytes"}`,
	`{"role":"assistant","content":""}`,
	`{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"UklGRg==","format":"wav"}},{"type":"mystery","x":1}]}`,
}

var anthropicConversation = []string{
	`{"role":"user","content":"Hi"}`,
	`{"role":"assistant","content":[{"type":"thinking","thinking":"greet","signature":"s"},{"type":"text","text":"Hello."}]}`,
	`{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},{"type":"text","text":"and this?","cache_control":{"type":"ephemeral"}}]}`,
	`{"role":"assistant","content":[{"type":"tool_use","id":"tu_1","name":"lookup","input":{"q":"cat"}}]}`,
	`{"role":"user","content":[{"type":"tool_result","tool_use_id":"tu_1","content":[{"type":"text","text":"a cat"}]}]}`,
	`{"role":"assistant","content":"It is a cat."}`,
	`{"role":"user","content":[{"type":"document","source":{"type":"text","media_type":"text/plain","data":"doc"}},{"type":"web_search_tool_result","tool_use_id":"x","content":[]}]}`,
}

// TestPrefixProperty checks that a request resending the conversation plus
// one more message has the earlier request's key as an exact prefix.
func TestPrefixProperty(t *testing.T) {
	for _, tc := range []struct {
		name   string
		e      Endpoint
		head   string
		turns  []string
		suffix string
	}{
		{"chat", ChatCompletions, `{"model":"m","messages":[`, conversation, `],"temperature":0}`},
		{"anthropic with system", Messages, `{"model":"c","max_tokens":5,"system":[{"type":"text","text":"sys"}],"messages":[`, anthropicConversation, `]}`},
		{"anthropic without system", Messages, `{"messages":[`, anthropicConversation, `]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var prev []byte
			for k := 1; k <= len(tc.turns); k++ {
				body := tc.head + strings.Join(tc.turns[:k], ",") + tc.suffix
				cur := mustExtract(t, tc.e, body).Key
				if !bytes.HasPrefix(cur, prev) {
					t.Fatalf("T(messages[:%d]) = %q is not a prefix of T(messages[:%d]) = %q", k-1, prev, k, cur)
				}
				if len(cur) == len(prev) {
					t.Fatalf("message %d added nothing to the key", k-1)
				}
				prev = cur
			}
		})
	}
}

func TestAppendKey(t *testing.T) {
	body := []byte(`{"messages":[{"role":"user","content":"hello"}]}`)
	want := mustExtract(t, ChatCompletions, string(body)).Key
	buf := make([]byte, 3, 64)
	copy(buf, "pre")
	r, err := AppendKey(buf, ChatCompletions, body)
	if err != nil {
		t.Fatal(err)
	}
	if string(r.Key) != "pre"+string(want) {
		t.Errorf("AppendKey = %q, want %q", r.Key, "pre"+string(want))
	}
	if &r.Key[0] != &buf[0] {
		t.Error("AppendKey did not reuse the buffer")
	}
	// Separators that depend on what the key already holds must not see dst.
	r, err = AppendKey([]byte("pre"), Completions, []byte(`{"prompt_embeds":"AAAA"}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := "pre" + key(t, Completions, `{"prompt_embeds":"AAAA"}`); string(r.Key) != want {
		t.Errorf("AppendKey = %q, want %q", r.Key, want)
	}
}

// TestKeyNotAliasingBody guards against the key sharing memory with the
// body, which the caller may reuse once Extract returns.
func TestKeyNotAliasingBody(t *testing.T) {
	body := []byte(`{"prompt":"abcdef"}`)
	r := mustExtract(t, Completions, string(body))
	for i := range body {
		body[i] = 'x'
	}
	if string(r.Key) != "abcdef" {
		t.Errorf("key changed with the body: %q", r.Key)
	}
}

// A decode error's JSON Pointer is named as the APIs name fields: the
// data says whether a token is an index or a key.
func TestPointerPath(t *testing.T) {
	data := []byte(`{"a": [1, {"b": "x", "c": [true, null]}], "d": {}, "e": [[2]], "0": {"1": [5]}, "s/t~u": 1}`)
	for ptr, want := range map[jsontext.Pointer]string{
		"":         "",
		"/a":       "a",
		"/a/0":     "a[0]",
		"/a/1":     "a[1]",
		"/a/1/b":   "a[1].b",
		"/a/1/c/1": "a[1].c[1]",
		"/d":       "d",
		"/e/0/0":   "e[0][0]",
		"/0/1/0":   "0.1[0]",
		"/s~1t~0u": "s/t~u",
	} {
		if got, ok := pointerPath(data, ptr); !ok || got != want {
			t.Errorf("pointerPath(%q) = %q, %v; want %q", ptr, got, ok, want)
		}
	}
	for _, ptr := range []jsontext.Pointer{"/x", "/a/9", "/a/x", "/a/0/b", "/d/x"} {
		if got, ok := pointerPath(data, ptr); ok {
			t.Errorf("pointerPath(%q) = %q for a value that is not there", ptr, got)
		}
	}
	if _, ok := pointerPath([]byte(`{"b":1,]`), "/a"); ok {
		t.Error("pointerPath on invalid JSON found a value")
	}
}

// objectPath names the object at a byte offset, as the walk's refusals
// need it.
func TestObjectPath(t *testing.T) {
	data := `{"a": [1, {"b": "x", "c": [{}]}], "d": {"e": {"f": 1}}}`
	for sub, want := range map[string]string{
		`{"a"`: "",
		`{"b"`: "a[1]",
		`{}]`:  "a[1].c[0]",
		`{"e"`: "d",
		`{"f"`: "d.e",
	} {
		off := int64(strings.Index(data, sub))
		if got, ok := objectPath([]byte(data), off); !ok || got != want {
			t.Errorf("objectPath(%d, at %s) = %q, %v; want %q", off, sub, got, ok, want)
		}
	}
	for _, off := range []int64{1, 5, 1000} {
		if got, ok := objectPath([]byte(data), off); ok {
			t.Errorf("objectPath(%d) = %q where no object starts", off, got)
		}
	}
}

func TestURLScheme(t *testing.T) {
	for _, tc := range []struct {
		lit  string // JSON string content, escapes not decoded
		want urlKind
	}{
		{`http://a`, schemeHTTP},
		{`https://a`, schemeHTTP},
		{`HtTpS://a`, schemeHTTP},
		{`https:a`, schemeHTTP},
		{`  \u0000https://a`, schemeHTTP},
		{`\u0020\u001fhttp://a`, schemeHTTP},
		{`h\nttp://a`, schemeHTTP},
		{`ht\ttp://a`, schemeHTTP},
		{`\u0068ttp://a`, schemeHTTP},
		{`httpss://a`, schemeHTTP}, // vLLM: scheme.startswith("http")
		{`http+unix://a`, schemeHTTP},
		{`file:///etc/passwd`, schemeFile},
		{`FILE:/etc/passwd`, schemeFile},
		{`files:/x`, schemeNone},
		{`data:image/png;base64,AAAA`, schemeNone},
		{`ftp://a`, schemeNone},
		{`http`, schemeNone},
		{``, schemeNone},
		{`/relative/http://a`, schemeNone},
		{`1http://a`, schemeNone},
		{`\u00e9http://a`, schemeNone},
		{`htt\p://a`, schemeNone},
	} {
		if got := urlScheme([]byte(tc.lit)); got != tc.want {
			t.Errorf("urlScheme(%q) = %v, want %v", tc.lit, got, tc.want)
		}
	}
}

// TestLargeInputs exercises sizes far beyond the preallocation bound.
func TestLargeInputs(t *testing.T) {
	text := strings.Repeat("word \"quoted\"\n", 20000)
	enc, _ := json.Marshal(text)
	r := mustExtract(t, Completions, fmt.Sprintf(`{"prompt":%s}`, enc))
	if string(r.Key) != text {
		t.Error("large prompt not reproduced")
	}
	ids := make([]int, 200000)
	for i := range ids {
		ids[i] = i
	}
	enc, _ = json.Marshal(ids)
	r = mustExtract(t, Completions, fmt.Sprintf(`{"prompt":%s}`, enc))
	if n := bytes.Count(r.Key, []byte(US)); n != len(ids) {
		t.Errorf("%d ids rendered, want %d", n, len(ids))
	}
	r = mustExtract(t, ChatCompletions, string(imageBody(4<<20)))
	if len(r.Key) > 100 {
		t.Errorf("image copied into the key: %d bytes", len(r.Key))
	}
}
