package extract

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/cartrouter/cart/dataplane/apierr"
)

// fuzzSeeds are realistic bodies per endpoint; FuzzExtract picks the
// endpoint from the first input byte so that one target covers all four.
var fuzzSeeds = map[Endpoint][]string{
	ChatCompletions: {
		`{"model":"m","messages":[` + strings.Join(conversation, ",") + `],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"messages":[{"role":"user","content":["a",{"type":"input_image","image_url":"https://x/a.png"},{"image_url":{"url":"data:x"},"uuid":"u"}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"file","file":{"file_data":"data:application/pdf;base64,JVBER","filename":"a.pdf"}},{"type":"video_url","video_url":"http://v"}]}]}`,
		`{"messages":[{"role":"assistant","function_call":{"name":"f","arguments":{"a":[1,2]}}},{"role":"user","content":[{"type":"x","image_url":5}]}]}`,
		`{"messages":[{"role":5}]}`,
		`{"messages":[]}`,
		`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://a","URL":"data:x"}}]}],"Messages":[]}`,
		`{"messages":[{"role":"user","content":[{"type":"x","uuid":"u","image_url":"http://a","audio_url":{"url":"file:/a"}}]}]}`,
		`{"cache_salt":"s","messages":[{"role":"developer","content":[{"type":"text","text":"x-anthropic-billing-header\u003a 1"},"x-anthropic-billing-header"]},{"role":"system","name":"n","content":"x-anthropic-billing-header"}]}`,
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
		`{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"http://a","Type":"base64"}}]}]}`,
		`{"cache_salt":"s","system":[{"type":"text","text":"x-anthropic-billing-header: cch=1;"},{"type":"text","text":"sys"}],"messages":[{"role":"user","content":"hi"}]}`,
	},
	Responses: {
		`{"model":"m","instructions":"be terse","input":"hi","stream":true,"previous_response_id":"resp_1"}`,
		`{"input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"https://x/a.png"},{"type":"input_file","file_url":"file:///a"}]}]}`,
		`{"input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":[{"type":"input_image","image_url":"data:x"}]}]}`,
		`{"input":[{"type":"reasoning","summary":[{"type":"summary_text","text":"t"}],"content":[{"type":"reasoning_text","text":"r"}],"encrypted_content":"e"},{"type":"web_search_call","action":{"url":"http://a"}}]}`,
		`{"input":[{"type":"message","content":"x"}],"Input":"y"}`,
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
		e := Endpoint(data[0]%4 + 1)
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
		// Ignoring system blocks changes the key, never what is accepted,
		// and never adds text.
		r3, err := ExtractOptions(e, body, Options{})
		if err != nil {
			t.Fatalf("accepted with the default prefixes, refused without: %v", err)
		}
		if len(r3.Key) < len(r.Key) || r3.CacheSalt != r.CacheSalt {
			t.Fatalf("ignoring prefixes lengthened the key: %q / %q", r.Key, r3.Key)
		}
		// The decode levels only add refusals: what the routed scan finds
		// in media fields is what the pass-through scan finds.
		if m, err := ScanMedia(body); err != nil || m.Remote != r.RemoteMediaURL || m.File != r.FileMediaURL {
			t.Fatalf("ScanMedia %+v, %v; Extract found %q %q", m, err, r.RemoteMediaURL, r.FileMediaURL)
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
		for e := ChatCompletions; e <= Responses; e++ {
			f.Add(byte(e-1), v)
		}
	}
	f.Fuzz(func(t *testing.T, sel byte, v string) {
		e := Endpoint(sel%4 + 1)
		var body string
		switch e {
		case Completions:
			body = `{"prompt":` + v + `}`
		case Messages:
			body = `{"system":` + v + `,"messages":[{"role":"user","content":` + v + `}]}`
		case Responses:
			body = `{"instructions":` + v + `,"input":[{"role":"user","content":` + v + `},{"type":"function_call_output","call_id":"c","output":` + v + `},{"type":"reasoning","content":` + v + `,"summary":[]}]}`
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

// FuzzScanMedia checks the walker against a reference built on
// encoding/json's tokenizer: on any valid JSON both must agree on whether
// an object repeats a key (up to case) and on the first remote and file:
// media URLs. The walker must never panic or reject valid JSON.
func FuzzScanMedia(f *testing.F) {
	for _, s := range []string{
		`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://a","URL":"data:x"}}]}]}`,
		`{"Messages":[{"content":[{"type":"x","uuid":"u","image_url":"https://a"}]}]}`,
		`{"input":[{"content":[{"type":"input_image","image_url":"\u0068ttp://a"}]}],"tools":[{"parameters":{"url":"http://x"}}]}`,
		`{"text":"t","image_data":[" \t\nfile:/x","data:,",["HTTPs:y"]],"sampling_params":{"max_new_tokens":1}}`,
		`[{"source":{"type":"text","data":"http://x","text":"http://y","Data":"http://z"}}]`,
		`{"a\u0000":1,"A\u0000":2}`,
		`{"ſ":1,"S":2,"K":3,"k":4}`,
		`{"x":[1,-2.5e3,true,false,null,"\"\\"],"image":"ht\ttp://a\"b"}`,
		`{"metadata":{"image":"http://a"},"source":{"metadata":{"u":"http://b"}}}`,
		`{"messages":[{"content":[{"type":"tool_use","input":{"image_url":"http://a"}}]}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ScanMedia(data)
		if err != nil {
			var ae *apierr.Error
			if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || ae.Message == "" {
				t.Fatalf("error %v (%T) is not a 400 *apierr.Error", err, err)
			}
		}
		if !json.Valid(data) || (firstByte(data) != '{' && firstByte(data) != '[') {
			return
		}
		ref, ok := refParse(data)
		if !ok {
			t.Skip("the reference could not parse it")
		}
		var r refResult
		r.scan(ref, modeScan, true)
		switch {
		case r.dup:
			var ae *apierr.Error
			if !errors.As(err, &ae) || ae.Code != "duplicate_key" {
				t.Fatalf("reference found a repeated key, ScanMedia: %v", err)
			}
		case err != nil:
			t.Fatalf("valid JSON refused: %v", err)
		case m != r.media:
			t.Fatalf("ScanMedia %+v, reference %+v", m, r.media)
		}
	})
}

// refNode is a JSON value with object members in document order, read by
// the standard library's v1 tokenizer: the reference, independent of the
// decoder extraction uses, of FuzzScanMedia and FuzzEngineSemantics.
type refNode struct {
	kind  byte // '{', '[', '"', 'b' (bool), 'n' (null), or 0 for a number
	str   string
	b     bool
	keys  []string
	elems []*refNode
}

func refParse(data []byte) (*refNode, bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	n, ok := refValue(dec)
	if !ok {
		return nil, false
	}
	if _, err := dec.Token(); err == nil {
		return nil, false
	}
	return n, true
}

func refValue(dec *json.Decoder) (*refNode, bool) {
	tok, err := dec.Token()
	if err != nil {
		return nil, false
	}
	switch v := tok.(type) {
	case json.Delim:
		n := &refNode{kind: byte(v)}
		for dec.More() {
			if v == '{' {
				k, err := dec.Token()
				if err != nil {
					return nil, false
				}
				n.keys = append(n.keys, k.(string))
			}
			e, ok := refValue(dec)
			if !ok {
				return nil, false
			}
			n.elems = append(n.elems, e)
		}
		_, err := dec.Token() // closing delimiter
		return n, err == nil
	case string:
		return &refNode{kind: '"', str: v}, true
	case bool:
		return &refNode{kind: 'b', b: v}, true
	case nil:
		return &refNode{kind: 'n'}, true
	}
	return &refNode{}, true
}

type refResult struct {
	dup   bool
	media Media
}

var refMediaKeys = []string{
	"image_url", "image_urls", "input_image", "audio_url", "video_url",
	"input_audio", "input_video", "input_file", "file", "files", "file_url", "file_data", "file_id",
	"image", "images", "image_data", "audio", "audio_data", "video", "video_data", "videos",
	"source", "url", "urls", "media", "media_url",
}

func (r *refResult) scan(n *refNode, m mode, top bool) {
	switch n.kind {
	case '"':
		if m != modeMedia {
			return
		}
		var dst *string
		switch refScheme(n.str) {
		case schemeHTTP:
			dst = &r.media.Remote
		case schemeFile:
			dst = &r.media.File
		default:
			return
		}
		if *dst == "" {
			*dst = n.str
		}
	case '[':
		if m == modeExempt {
			m = modeMedia
		}
		for _, e := range n.elems {
			r.scan(e, m, false)
		}
	case '{':
		if m == modeExempt {
			m = modeMedia
		}
		if m != modeOpaque {
			for i := range n.keys {
				for j := range i {
					if strings.EqualFold(n.keys[i], n.keys[j]) {
						r.dup = true
					}
				}
			}
		}
		for i, k := range n.keys {
			cm := modeOpaque
			switch {
			case m == modeOpaque:
			case m == modeMedia && (k == "text" || k == "data"):
				cm = modeExempt
			case m == modeMedia:
				cm = modeMedia
			case slices.ContainsFunc(refMediaKeys, func(mk string) bool { return strings.EqualFold(mk, k) }):
				cm = modeMedia
			case slices.Contains([]string{"arguments", "parameters", "input_schema", "json_schema", "schema", "guided_json", "structured_outputs", "metadata", "citations", "annotations"}, k),
				k == "input" && !top:
			default:
				cm = modeScan
			}
			r.scan(n.elems[i], cm, false)
		}
	}
}

// refScheme is urlsplit's scheme rule on a decoded string.
func refScheme(s string) urlKind {
	s = strings.TrimLeftFunc(s, func(r rune) bool { return r <= ' ' })
	s = strings.NewReplacer("\t", "", "\n", "", "\r", "").Replace(s)
	i := strings.IndexByte(s, ':')
	if i <= 0 {
		return schemeNone
	}
	for j, c := range []byte(s[:i]) {
		letter := 'a' <= c|0x20 && c|0x20 <= 'z'
		if !letter && (j == 0 || !('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return schemeNone
		}
	}
	switch scheme := strings.ToLower(s[:i]); {
	case strings.HasPrefix(scheme, "http"):
		return schemeHTTP
	case scheme == "file":
		return schemeFile
	}
	return schemeNone
}
