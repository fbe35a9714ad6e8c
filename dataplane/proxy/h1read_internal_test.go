package proxy

import (
	"bufio"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// readResponse reads every answer as http.ReadResponse does (status,
// headers, length, body, what is left on the connection), whether its fast
// path takes the answer or hands it over.
func TestReadResponseMatchesReadResponse(t *testing.T) {
	const next = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
	cases := map[string]struct {
		raw  string
		head bool
		fast bool // taken by the fast path
	}{
		"json":               {raw: "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\ndate: x\r\nX-Multi: a\r\nx-multi: b\r\nX-Pad:  v \t\r\n\r\n{\"ok\":true}", fast: true},
		"empty":              {raw: "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", fast: true},
		"no reason":          {raw: "HTTP/1.1 503\r\nContent-Length: 2\r\n\r\nno", fast: true},
		"same length twice":  {raw: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok"},
		"chunked":            {raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n2\r\nok\r\n0\r\nX-T: 1\r\n\r\n"},
		"connection close":   {raw: "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"},
		"close delimited":    {raw: "HTTP/1.1 200 OK\r\n\r\nuntil the end"},
		"http/1.0":           {raw: "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"},
		"no content":         {raw: "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n"},
		"head":               {raw: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", head: true},
		"interim":            {raw: "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"},
		"obs-fold":           {raw: "HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\nContent-Length: 2\r\n\r\nok"},
		"space before colon": {raw: "HTTP/1.1 200 OK\r\nContent-Length : 2\r\nContent-Length: 2\r\n\r\nok"},
		"plus length":        {raw: "HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok"},
		"lengths differ":     {raw: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok!"},
		"bare cr in value":   {raw: "HTTP/1.1 200 OK\r\nX-A: a\rb\r\nContent-Length: 2\r\n\r\nok"},
		"short body":         {raw: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nok", fast: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			method := http.MethodPost
			if tc.head {
				method = http.MethodHead
			}
			req, _ := http.NewRequest(method, "http://w:1/x", nil)
			want := readBoth(t, http.ReadResponse, tc.raw+next, req)
			got := readBoth(t, readResponse, tc.raw+next, req)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("readResponse\n%+v\nhttp.ReadResponse\n%+v", got, want)
			}
			br := bufio.NewReader(strings.NewReader(tc.raw + next))
			_, _ = br.Peek(1)
			if fast := fastResponse(br, req) != nil; fast != tc.fast {
				t.Fatalf("fast path taken: %v, want %v", fast, tc.fast)
			}
		})
	}
}

type readBack2 struct {
	Err                       string
	Status                    string
	Code                      int
	Proto                     string
	Header, Trailer           http.Header
	Length                    int64
	Close                     bool
	Body, BodyErr, Afterwards string
}

func readBoth(t *testing.T, read func(*bufio.Reader, *http.Request) (*http.Response, error), raw string, req *http.Request) readBack2 {
	t.Helper()
	br := bufio.NewReader(strings.NewReader(raw))
	resp, err := read(br, req)
	if err != nil {
		return readBack2{Err: err.Error()}
	}
	body, berr := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	out := readBack2{Status: resp.Status, Code: resp.StatusCode, Proto: resp.Proto, Header: resp.Header, Trailer: resp.Trailer,
		Length: resp.ContentLength, Close: resp.Close, Body: string(body)}
	if berr != nil {
		out.BodyErr = berr.Error()
	}
	rest, _ := io.ReadAll(br)
	out.Afterwards = string(rest)
	return out
}

// Whatever a worker sends, readResponse never panics and reads it as
// http.ReadResponse does.
func FuzzReadResponse(f *testing.F) {
	f.Add("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\nok")
	f.Add("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: 1\r\n\r\nokHTTP/1.1 204 x\r\n\r\n")
	f.Add("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
	f.Add("HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n")
	f.Fuzz(func(t *testing.T, raw string) {
		req, _ := http.NewRequest(http.MethodPost, "http://w:1/x", nil)
		want := readBoth(t, http.ReadResponse, raw, req)
		got := readBoth(t, readResponse, raw, req)
		if (got.Err == "") != (want.Err == "") {
			t.Fatalf("readResponse error %q, http.ReadResponse error %q", got.Err, want.Err)
		}
		if want.Err == "" && !reflect.DeepEqual(got, want) {
			t.Fatalf("readResponse\n%+v\nhttp.ReadResponse\n%+v", got, want)
		}
	})
}
