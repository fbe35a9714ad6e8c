package extract

import (
	"regexp"
	"strings"
	"testing"
)

func TestResponsesEndpoint(t *testing.T) {
	ep, ok := EndpointForPath("/v1/responses")
	if !ok || ep != Responses || ep.String() != "responses" {
		t.Fatalf("EndpointForPath(/v1/responses) = %v, %v (%q)", ep, ok, ep.String())
	}
	if _, ok := EndpointForPath("/v1/responses/resp_1"); ok {
		t.Fatal("a stored response's path is not the routed endpoint")
	}
}

func TestResponsesKey(t *testing.T) {
	checkKeys(t, Responses, []keyCase{
		{"string input", `{"model":"m","input":"hi"}`, "user" + US + "hi" + RS},
		{"instructions", `{"instructions":"be terse","input":"hi"}`, "system" + US + "be terse" + RS + "user" + US + "hi" + RS},
		{"easy message list", `{"input":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]}`,
			"user" + US + "a" + RS + "assistant" + US + "b" + RS},
		{"typed message with parts", `{"input":[{"type":"message","role":"user","id":"msg_1","status":"completed","content":[{"type":"input_text","text":"x"},{"type":"output_text","text":"y","annotations":[]}]}]}`,
			"user" + US + "x" + US + "y" + RS},
		{"function call and output", `{"input":[{"type":"function_call","id":"fc_1","call_id":"c1","name":"f","arguments":"{\"a\":1}"},{"type":"function_call_output","call_id":"c1","output":"42"}]}`,
			"assistant" + US + NUL + "tool_call:c1" + GS + "f" + GS + `{"a":1}` + RS + "tool" + US + NUL + "call_id:c1" + US + "42" + RS},
		{"reasoning summary", `{"input":[{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"thought"}]}]}`,
			"reasoning" + US + NUL + "think:thought" + RS},
		{"no input", `{"previous_response_id":"resp_1"}`, ""},
	})
}

// A string input routes like the same chat user message: vLLM renders both
// through the same chat template.
func TestResponsesMatchesChat(t *testing.T) {
	r := key(t, Responses, `{"instructions":"sys","input":[{"role":"user","content":[{"type":"input_text","text":"q"}]}]}`)
	c := key(t, ChatCompletions, `{"messages":[{"role":"system","content":"sys"},{"role":"user","content":"q"}]}`)
	if r != c {
		t.Fatalf("responses key %q != chat key %q", r, c)
	}
}

func TestResponsesMediaAndUnknownItems(t *testing.T) {
	k := key(t, Responses, `{"input":[{"role":"user","content":[
		{"type":"input_image","image_url":"data:image/png;base64,AAAA","detail":"low"},
		{"type":"input_file","filename":"a.pdf","file_data":"data:application/pdf;base64,JVBE"},
		{"type":"input_audio","input_audio":{"data":"UklG","format":"wav"}}]},
		{"type":"web_search_call","id":"ws_1","status":"completed","action":{"query":"q"}},
		{"type":"reasoning","summary":[],"encrypted_content":"gAAAA"}]}`)
	re := regexp.MustCompile(`^user` + US + NUL + "img:" + hashRE + US + NUL + "file:" + hashRE + US + NUL + "audio:" + hashRE + RS +
		"item" + US + NUL + "part:web_search_call:" + hashRE + RS + "reasoning" + US + NUL + "redacted_think:" + hashRE + RS + "$")
	if !re.MatchString(k) {
		t.Fatalf("key %q", k)
	}
	// Different media data give different keys.
	a := key(t, Responses, `{"input":[{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,AAAA"}]}]}`)
	b := key(t, Responses, `{"input":[{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,BBBB"}]}]}`)
	f := key(t, Responses, `{"input":[{"role":"user","content":[{"type":"input_file","file_data":"data:application/pdf;base64,BBBB","filename":"x"}]}]}`)
	g := key(t, Responses, `{"input":[{"role":"user","content":[{"type":"input_file","file_data":"data:application/pdf;base64,CCCC","filename":"x"}]}]}`)
	if a == b || f == g {
		t.Fatalf("media not told apart: %q %q / %q %q", a, b, f, g)
	}
}

// A client that does not store responses resends the whole conversation,
// with the earlier answer's output items (ids, statuses and all): each
// request's key must extend the previous one's.
func TestResponsesPrefixProperty(t *testing.T) {
	items := []string{
		`{"role":"user","content":"Weather in Paris?"}`,
		`{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"call the tool"}]}`,
		`{"type":"function_call","id":"fc_1","call_id":"c1","name":"weather","arguments":"{\"city\":\"Paris\"}","status":"completed"}`,
		`{"type":"function_call_output","call_id":"c1","output":[{"type":"input_text","text":"18C"}]}`,
		`{"type":"message","id":"msg_1","role":"assistant","status":"completed","content":[{"type":"output_text","text":"18C.","annotations":[]}]}`,
		`{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,iVBORw0KGgo="},{"type":"input_text","text":"and this?"}]}`,
	}
	prev := ""
	for n := 1; n <= len(items); n++ {
		body := `{"model":"m","instructions":"terse","input":[` + strings.Join(items[:n], ",") + `],"stream":true}`
		k := key(t, Responses, body)
		if !strings.HasPrefix(k, prev) || len(k) <= len(prev) {
			t.Fatalf("turn %d: key %q does not extend %q", n, k, prev)
		}
		prev = k
	}
}

func TestResponsesRequestFields(t *testing.T) {
	r := mustExtract(t, Responses, `{"model":"m","stream":true,"user":"u","prompt_cache_key":"p","previous_response_id":"resp_\u0041b","input":"x"}`)
	if r.Model != "m" || !r.Stream || r.User != "u" || r.PromptCacheKey != "p" || r.PreviousResponseID != "resp_Ab" {
		t.Fatalf("fields: %+v", r)
	}
}

func TestResponsesErrors(t *testing.T) {
	for _, tc := range []struct{ name, body, code, param string }{
		{"input number", `{"input":3}`, "invalid_type", "input"},
		{"instructions object", `{"instructions":{},"input":"x"}`, "invalid_type", "instructions"},
		{"item not object", `{"input":["x"]}`, "invalid_type", "input[0]"},
		{"message without role", `{"input":[{"type":"message","content":"x"}]}`, "missing_required_parameter", "input[0].role"},
		{"message without content", `{"input":[{"role":"user"}]}`, "missing_required_parameter", "input[0].content"},
		{"content number", `{"input":[{"role":"user","content":1}]}`, "invalid_type", "input[0].content"},
		{"previous id number", `{"previous_response_id":1,"input":"x"}`, "invalid_type", "previous_response_id"},
		{"input_file empty", `{"input":[{"role":"user","content":[{"type":"input_file"}]}]}`, "missing_required_parameter", "input[0].content[0].file_data"},
		{"case variant of input", `{"input":"x","Input":"y"}`, "duplicate_key", ""},
		{"case variant image_url", `{"input":[{"role":"user","content":[{"type":"input_image","image_url":"data:x","Image_URL":"data:y"}]}]}`, "duplicate_key", "input[0].content[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Extract(Responses, []byte(tc.body))
			wantBadRequest(t, err, tc.code, tc.param)
		})
	}
}

func TestResponsesRemoteMedia(t *testing.T) {
	for _, tc := range []struct{ name, body, remote, file string }{
		{"input_image url", `{"input":[{"role":"user","content":[{"type":"input_image","image_url":"https://x/a.png"}]}]}`, "https://x/a.png", ""},
		{"input_file url", `{"input":[{"role":"user","content":[{"type":"input_file","file_url":"http://x/a.pdf"}]}]}`, "http://x/a.pdf", ""},
		{"file url in tool output", `{"input":[{"type":"function_call_output","call_id":"c","output":[{"type":"input_image","image_url":"file:///etc/passwd"}]}]}`, "", "file:///etc/passwd"},
		{"text mentioning a url", `{"input":"see https://x/a.png"}`, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustExtract(t, Responses, tc.body)
			if r.RemoteMediaURL != tc.remote || r.FileMediaURL != tc.file {
				t.Fatalf("remote %q file %q, want %q %q", r.RemoteMediaURL, r.FileMediaURL, tc.remote, tc.file)
			}
		})
	}
}
