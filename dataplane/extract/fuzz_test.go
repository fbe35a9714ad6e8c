package extract

import (
	"bytes"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/cartrouter/cart/dataplane/apierr"
)

// fuzzSeeds are realistic bodies per endpoint; FuzzExtract picks the
// endpoint from the first input byte so that one target covers all three.
var fuzzSeeds = map[Endpoint][]string{
	ChatCompletions: {
		`{"model":"m","messages":[` + strings.Join(conversation, ",") + `],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"messages":[{"role":"user","content":["a",{"type":"input_image","image_url":"https://x/a.png"},{"image_url":{"url":"data:x"},"uuid":"u"}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"file","file":{"file_data":"data:application/pdf;base64,JVBER","filename":"a.pdf"}},{"type":"video_url","video_url":"http://v"}]}]}`,
		`{"messages":[{"role":"assistant","function_call":{"name":"f","arguments":{"a":[1,2]}}},{"role":"user","content":[{"type":"x","image_url":5}]}]}`,
		`{"messages":[{"role":5}]}`,
		`{"messages":[]}`,
	},
	Completions: {
		`{"model":"m","prompt":"Once upon a time","max_tokens":16}`,
		`{"prompt":["a","b\u0000"],"stream":true}`,
		`{"prompt":[1,2,3,-4]}`,
		`{"prompt":[[1,2],[3],[]]}`,
		`{"prompt":[[1],2.5]}`,
		`{"prompt_embeds":"AAAA"}`,
	},
	Messages: {
		`{"model":"c","max_tokens":5,"system":[{"type":"text","text":"sys","cache_control":{"type":"ephemeral"}}],"messages":[` + strings.Join(anthropicConversation, ",") + `]}`,
		`{"system":"s","messages":[{"role":"user","content":[{"type":"document","source":{"type":"content","content":[{"type":"image","source":{"type":"url","url":"https://x"}}]}}]}],"metadata":{"user_id":"u"}}`,
		`{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"tool_result","content":"x"}]}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"file","file_id":"f"}},{"type":"redacted_thinking","data":"x"}]}]}`,
	},
}

func FuzzExtract(f *testing.F) {
	for e, bodies := range fuzzSeeds {
		for _, b := range bodies {
			f.Add(append([]byte{byte(e - 1)}, b...))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		e := Endpoint(data[0]%3 + 1)
		body := data[1:]
		orig := bytes.Clone(body)
		r, err := Extract(e, body)
		if !bytes.Equal(body, orig) {
			t.Fatal("Extract modified the body")
		}
		if err != nil {
			var ae *apierr.Error
			if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
				t.Fatalf("error %v (%T) is not a 400 *apierr.Error", err, err)
			}
			if ae.Message == "" || ae.Code == "" {
				t.Fatalf("error without message or code: %+v", ae)
			}
			return
		}
		// The key must be a function of the body alone, and AppendKey must
		// only append.
		r2, err := AppendKey([]byte("prefix"), e, body)
		if err != nil {
			t.Fatalf("second extraction failed: %v", err)
		}
		if string(r2.Key) != "prefix"+string(r.Key) || r2.RemoteMediaURL != r.RemoteMediaURL {
			t.Fatalf("not deterministic: %q / %q", r.Key, r2.Key)
		}
	})
}

// FuzzContentValue splices the input into a valid envelope as a message's
// content (or the prompt), where random bytes reach far more of the
// content handling than they do from the top of the body.
func FuzzContentValue(f *testing.F) {
	for _, v := range []string{
		`"hi"`, `null`, `[]`, `["a",1]`, `[1,2]`, `[[1],[2,3]]`,
		`[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"https://x"}}]`,
		`[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}}]`,
		`[{"type":"tool_result","tool_use_id":"t","is_error":true,"content":[{"type":"text","text":"x"}]}]`,
		`[{"type":"input_audio","input_audio":{"data":"AA","format":"wav"},"uuid":"u"}]`,
		`[{"type":"document","source":{"type":"content","content":"x"}}]`,
		`[{"type":"tool_use","id":"1","name":"n","input":{"a":[1,{"b":null}]}}]`,
	} {
		for e := ChatCompletions; e <= Messages; e++ {
			f.Add(byte(e-1), v)
		}
	}
	f.Fuzz(func(t *testing.T, sel byte, v string) {
		e := Endpoint(sel%3 + 1)
		var body string
		switch e {
		case Completions:
			body = `{"prompt":` + v + `}`
		case Messages:
			body = `{"system":` + v + `,"messages":[{"role":"user","content":` + v + `}]}`
		default:
			body = `{"messages":[{"role":"user","content":` + v + `},{"role":"assistant","tool_calls":[{"id":"1","function":{"name":"f","arguments":` + v + `}}]}]}`
		}
		_, err := Extract(e, []byte(body))
		if err != nil {
			var ae *apierr.Error
			if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
				t.Fatalf("error %v (%T) is not a 400 *apierr.Error", err, err)
			}
		}
	})
}
