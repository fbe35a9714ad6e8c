package proxy

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"
)

// writeRequest puts on the wire what Request.Write would: the same request
// line, Host, framing, header fields (values cleaned the same way) and body,
// as a server reads them.
func TestWriteRequestMatchesRequestWrite(t *testing.T) {
	mk := func(method, target, body string, h http.Header) func() *http.Request {
		return func() *http.Request {
			u, _ := url.Parse(target)
			r := &http.Request{Method: method, URL: u, Header: h.Clone(), Body: http.NoBody}
			if body != "" {
				r.Body, r.ContentLength = io.NopCloser(strings.NewReader(body)), int64(len(body))
			}
			return r
		}
	}
	cases := map[string]func() *http.Request{
		"post with headers": mk("POST", "http://10.0.0.1:8000/v1/chat/completions", `{"model":"m"}`, http.Header{
			"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}, "X-Spaces": {"  padded\t"},
			"X-Break": {"one\r\ntwo"}, "Content-Length": {"999"}, "User-Agent": {""}, "Host": {"forged"},
		}),
		"get with query and default agent": mk("GET", "http://w:1/v1/models?a=1&b=%2F", "", http.Header{}),
		"escaped path":                     mk("GET", "http://w:1/a%20b/c", "", http.Header{"User-Agent": {"sdk/1"}}),
		"empty post":                       mk("POST", "http://w:1/x", "", http.Header{}),
		"empty delete":                     mk("DELETE", "http://w:1/v1/responses/resp_1", "", http.Header{}),
		"bad host falls back":              mk("GET", "http://[fe80::1%25eth0]:1/x", "", http.Header{}),
	}
	for name, build := range cases {
		t.Run(name, func(t *testing.T) {
			var want, got bytes.Buffer
			if err := build().Write(&want); err != nil {
				t.Fatal(err)
			}
			bw := bufio.NewWriter(&got)
			if err := writeRequest(bw, build()); err != nil {
				t.Fatal(err)
			}
			_ = bw.Flush()
			a, b := readBack(t, &want), readBack(t, &got)
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("writeRequest\n%q\nRequest.Write\n%q", got.String(), want.String())
			}
		})
	}
}

type wireRequest struct {
	Method, RequestURI, Host string
	ContentLength            int64
	Header                   http.Header
	Body                     string
}

func readBack(t *testing.T, b *bytes.Buffer) wireRequest {
	t.Helper()
	r, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(b.Bytes())))
	if err != nil {
		t.Fatalf("%q: %v", b.String(), err)
	}
	body, _ := io.ReadAll(r.Body)
	return wireRequest{r.Method, r.RequestURI, r.Host, r.ContentLength, r.Header, string(body)}
}

// A body shorter than its declared length is an error, as with
// Request.Write, not a request the worker waits on forever.
func TestWriteRequestShortBody(t *testing.T) {
	u, _ := url.Parse("http://w:1/x")
	r := &http.Request{Method: "POST", URL: u, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("abc")), ContentLength: 10}
	if err := writeRequest(bufio.NewWriter(io.Discard), r); err == nil {
		t.Fatal("a 3-byte body was sent as 10 bytes")
	}
}
