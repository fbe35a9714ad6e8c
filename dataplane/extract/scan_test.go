package extract

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/cartrouter/cart/dataplane/apierr"
)

func wantBadRequest(t *testing.T, err error, code, param string) {
	t.Helper()
	var ae *apierr.Error
	if !errors.As(err, &ae) {
		t.Fatalf("error %v, want a 400 %s", err, code)
	}
	if ae.Status != http.StatusBadRequest || ae.Code != code || ae.Param != param {
		t.Fatalf("got %d %s param %q (%s), want 400 %s param %q", ae.Status, ae.Code, ae.Param, ae.Message, code, param)
	}
}

// Each body below was forwarded with a remote URL intact while
// remote_media_url_policy was on: encoding/json read a key differently
// from the Python engines. They must now be refused before decoding.
func TestCaseVariantAndDuplicateKeysRefused(t *testing.T) {
	img := func(media string) string {
		return `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":` + media + `}]}]}`
	}
	for _, tc := range []struct {
		name, body, code, param string
		e                       Endpoint
	}{
		{"url and URL", img(`{"url":"http://169.254.169.254/x","URL":"data:image/png;base64,AA"}`), "duplicate_key", "messages[0].content[0].image_url", ChatCompletions},
		{"url twice", img(`{"url":"http://169.254.169.254/x","url":"data:image/png;base64,AA"}`), "duplicate_key", "messages[0].content[0].image_url", ChatCompletions},
		{"URL alone", img(`{"URL":"data:image/png;base64,AA"}`), "invalid_key", "messages[0].content[0].image_url", ChatCompletions},
		{"Messages after messages", `{"messages":[{"role":"user","content":"hi"}],"Messages":[{"role":"user","content":"x"}]}`, "duplicate_key", "", ChatCompletions},
		{"Messages alone", `{"Messages":[{"role":"user","content":"hi"}]}`, "invalid_key", "", ChatCompletions},
		{"unicode fold of messages", `{"meſſages":[{"role":"user","content":"hi"}]}`, "invalid_key", "", ChatCompletions},
		{"Content", `{"messages":[{"role":"user","content":"hi","Content":[{"type":"image_url","image_url":{"url":"data:x"}}]}]}`, "duplicate_key", "messages[0]", ChatCompletions},
		{"Image_URL", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:x"},"Image_URL":{"url":"data:y"}}]}]}`, "duplicate_key", "messages[0].content[0]", ChatCompletions},
		{"escaped duplicate key", img(`{"url":"http://a/x","\u0075rl":"data:x"}`), "duplicate_key", "messages[0].content[0].image_url", ChatCompletions},
		{"anthropic source Type", `{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"http://a/x","Type":"base64","data":"AA","media_type":"image/png"}}]}]}`, "duplicate_key", "messages[0].content[0].source", Messages},
		{"anthropic nested tool result", `{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"a","Text":"b"}]}]}]}`, "duplicate_key", "messages[0].content[0].content[0]", Messages},
		{"anthropic System", `{"system":"s","System":"t","messages":[{"role":"user","content":"x"}]}`, "duplicate_key", "", Messages},
		{"anthropic metadata user_id twice", `{"messages":[{"role":"user","content":"x"}],"metadata":{"user_id":"a","User_Id":"b"}}`, "duplicate_key", "metadata", Messages},
		{"completions Prompt", `{"Prompt":"x"}`, "invalid_key", "", Completions},
		{"duplicate unknown top-level key", `{"messages":[{"role":"user","content":"x"}],"temperature":1,"temperature":0}`, "duplicate_key", "", ChatCompletions},
		{"case pair in a tool definition", `{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","Type":"x"}]}`, "duplicate_key", "tools[0]", ChatCompletions},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Extract(tc.e, []byte(tc.body))
			wantBadRequest(t, err, tc.code, tc.param)
		})
	}
}

// Keys that only look alike are fine, and JSON the client controls in tool
// arguments and schemas is not the request's structure.
func TestKeysThatMustStillPass(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		e          Endpoint
	}{
		{"schema with case-variant properties", `{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"properties":{"ID":{},"id":{}}}}}]}`, ChatCompletions},
		{"arguments object with repeated keys", `{"messages":[{"role":"assistant","tool_calls":[{"id":"1","function":{"name":"f","arguments":{"a":1,"a":2}}}]}]}`, ChatCompletions},
		{"anthropic tool input", `{"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"1","name":"fetch","input":{"url":"https://example.com","URL":"x"}}]}]}`, Messages},
		{"many distinct keys", `{"messages":[{"role":"user","content":"x"}],` + manyKeyObject(200) + `}`, ChatCompletions},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustExtract(t, tc.e, tc.body)
			if r.RemoteMediaURL != "" {
				t.Errorf("RemoteMediaURL = %q, want none", r.RemoteMediaURL)
			}
		})
	}
	// Past the point where the check switches to a map, a repeat is still
	// found.
	body := `{"messages":[{"role":"user","content":"x"}],` + manyKeyObject(200) + `,"K7":1}`
	_, err := Extract(ChatCompletions, []byte(body))
	wantBadRequest(t, err, "duplicate_key", "")
}

func manyKeyObject(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"k` + itoa(i) + `":1`)
	}
	return b.String()
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}

// vLLM reads part["image_url"] (and the other media fields) of any part
// that carries a uuid, whatever its type; SGLang and the pass-through APIs
// read more fields still. Every media field of every part is checked.
func TestMediaInAnyFieldOfAnyPart(t *testing.T) {
	chat := func(part string) string {
		return `{"messages":[{"role":"user","content":[` + part + `]}]}`
	}
	for _, tc := range []struct {
		name, body, remote, file string
	}{
		{"unknown type with uuid and string image_url", chat(`{"type":"x-custom","uuid":"u","image_url":"http://a/1.png"}`), "http://a/1.png", ""},
		{"unknown type, object image_url", chat(`{"type":"x-custom","image_url":{"url":"https://a/2.png"}}`), "https://a/2.png", ""},
		{"text part with audio_url", chat(`{"type":"text","text":"t","audio_url":"http://a/3.wav"}`), "http://a/3.wav", ""},
		{"input_audio holding a url", chat(`{"type":"input_audio","input_audio":{"data":"AA","format":"wav","url":"http://a/4"}}`), "http://a/4", ""},
		{"image field", chat(`{"type":"x","image":"http://a/5"}`), "http://a/5", ""},
		{"file url", chat(`{"type":"image_url","image_url":{"url":"file:///etc/passwd"}}`), "", "file:///etc/passwd"},
		{"escaped scheme", chat(`{"type":"image_url","image_url":{"url":"\u0068ttp://a/7"}}`), "http://a/7", ""},
		{"text that looks like a url is text", chat(`{"type":"text","text":"http://a/8"}`), "", ""},
		{"base64 data is content", chat(`{"type":"input_audio","input_audio":{"data":"http://a/9","format":"wav"}}`), "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustExtract(t, ChatCompletions, tc.body)
			// The pass-through scan finds the same.
			if m, err := ScanMedia([]byte(tc.body)); err != nil || m.Remote != tc.remote || m.File != tc.file {
				t.Errorf("ScanMedia: %+v, %v", m, err)
			}
			if r.RemoteMediaURL != tc.remote || r.FileMediaURL != tc.file {
				t.Errorf("remote %q file %q, want %q %q", r.RemoteMediaURL, r.FileMediaURL, tc.remote, tc.file)
			}
		})
	}
}

// Bodies of the endpoints CART passes through are scanned the same way.
func TestScanMediaPassThroughBodies(t *testing.T) {
	for _, tc := range []struct {
		name, body, remote, file string
	}{
		{"responses input_image string", `{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"http://a/1"}]}]}`, "http://a/1", ""},
		{"responses input_image object", `{"input":[{"role":"user","content":[{"type":"input_image","image_url":{"url":"https://a/2"}}]}]}`, "https://a/2", ""},
		{"responses input_file", `{"input":[{"role":"user","content":[{"type":"input_file","file_url":"https://a/3.pdf"}]}]}`, "https://a/3.pdf", ""},
		{"embeddings with messages", `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://a/4"}}]}]}`, "http://a/4", ""},
		{"tokenize with Messages", `{"Messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://a/5"}}]}]}`, "http://a/5", ""},
		{"sglang image_data string", `{"text":"t","image_data":"http://a/6"}`, "http://a/6", ""},
		{"sglang image_data list", `{"text":["a","b"],"image_data":[["data:x","https://a/7"]]}`, "https://a/7", ""},
		{"sglang image_data file", `{"text":"t","image_data":"file:/x.png"}`, "", "file:/x.png"},
		{"sglang multimodal embedding input", `{"input":[{"text":"t","image":"http://a/8"}]}`, "http://a/8", ""},
		{"anthropic url source", `{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"http://a/9"}}]}]}`, "http://a/9", ""},
		{"case variant media key", `{"x":{"IMAGE_URL":"http://a/10"}}`, "http://a/10", ""},
		{"top-level array", `[{"image_url":"http://a/11"}]`, "http://a/11", ""},
		{"plain text body", `hello http://a`, "", ""},
		{"nothing remote", `{"input":"http://a/text","model":"m"}`, "", ""},
		{"nested tool input is opaque", `{"messages":[{"role":"assistant","content":[{"type":"tool_use","input":{"url":"http://a/12"}}]}]}`, "", ""},
		{"annotations of a web-search answer are opaque", `{"messages":[{"role":"assistant","content":"x","annotations":[{"type":"url_citation","url_citation":{"url":"https://a"}}]}]}`, "", ""},
		{"structured output schema is opaque", `{"structured_outputs":{"json":{"properties":{"image":{"default":"http://a"}}}}}`, "", ""},
		{"json schema is opaque", `{"response_format":{"type":"json_schema","json_schema":{"schema":{"properties":{"url":{"default":"http://a"}}}}}}`, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := ScanMedia([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if m.Remote != tc.remote || m.File != tc.file {
				t.Errorf("got %+v, want remote %q file %q", m, tc.remote, tc.file)
			}
		})
	}
}

func TestScanMediaRefusals(t *testing.T) {
	for _, tc := range []struct{ name, body, code, param string }{
		{"case pair", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://a","URL":"data:x"}}]}]}`, "duplicate_key", "messages[0].content[0].image_url"},
		{"repeated key outside any known level", `{"x":{"url":"data:x","url":"http://a"}}`, "duplicate_key", "x"},
		{"utf-8 byte order mark", "\xef\xbb\xbf{\"image_data\":\"http://a\"}", codeInvalidJSON, ""},
		{"utf-16", "{\x00\"\x00", codeInvalidJSON, ""},
		{"truncated", `{"image_url":"http://a"`, codeInvalidJSON, ""},
		{"garbage after value", `{"a":1} {"image_url":"http://a"}`, codeInvalidJSON, ""},
		{"unterminated string", `{"a":"\"}`, codeInvalidJSON, ""},
		{"too deep", strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1), codeInvalidJSON, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ScanMedia([]byte(tc.body))
			wantBadRequest(t, err, tc.code, tc.param)
		})
	}
}
