package extract

import (
	"testing"
	"unsafe"

	"github.com/go-json-experiment/json"
)

// rawJSON fields point into the body they were decoded from (no copy of a
// megabyte image), which holds only while the decoder reads the caller's
// input in place: a decoder that copied it into a pooled buffer would
// leave them pointing at memory the next request overwrites.
func TestRawJSONPointsIntoTheBody(t *testing.T) {
	body := []byte(`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`)
	var req chatRequest
	if err := unmarshal(body, &req); err != nil {
		t.Fatal(err)
	}
	var parts []chatPart
	if err := unmarshal(req.Messages[0].Content, &parts); err != nil {
		t.Fatal(err)
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(body)))
	for name, v := range map[string]rawJSON{"role": req.Messages[0].Role, "content": req.Messages[0].Content, "url": parts[0].ImageURL.URL} {
		p := uintptr(unsafe.Pointer(unsafe.SliceData(v)))
		if p < start || p+uintptr(len(v)) > start+uintptr(len(body)) {
			t.Errorf("%s %s is a copy, not a slice of the body", name, v)
		}
	}
	if string(parts[0].ImageURL.URL) != `"data:image/png;base64,AAAA"` {
		t.Errorf("url %s", parts[0].ImageURL.URL)
	}
}

// A rawJSON is written back as it came, and an absent one as null.
func TestRawJSONMarshal(t *testing.T) {
	out, err := json.Marshal(mediaURL{URL: rawJSON(`"a\u0062"`)}, compactOpts)
	if err != nil || string(out) != `{"url":"a\u0062"}` {
		t.Errorf("%s, %v", out, err)
	}
	out, err = json.Marshal(mediaURL{}, compactOpts)
	if err != nil || string(out) != `{"url":null}` {
		t.Errorf("%s, %v", out, err)
	}
}
