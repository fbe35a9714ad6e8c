package h1server

import (
	"bufio"
	"bytes"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

const post = "POST /v1/chat/completions HTTP/1.1\r\nHost: cart\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"

func TestParseHeadTakes(t *testing.T) {
	for name, tc := range map[string]struct {
		in     string
		method string
		length int64
		close  bool
		header http.Header
	}{
		"post":         {in: post, method: "POST", length: 2, header: http.Header{"Content-Type": {"application/json"}, "Content-Length": {"2"}}},
		"get":          {in: "GET /v1/models?x=1 HTTP/1.1\r\nHost: cart:8080\r\n\r\n", method: "GET", length: 0, header: http.Header{}},
		"post no body": {in: "POST /p HTTP/1.1\r\nHost: h\r\n\r\n", method: "POST", header: http.Header{}},
		"close":        {in: "GET / HTTP/1.1\r\nHost: h\r\nConnection: Close\r\n\r\n", method: "GET", close: true, header: http.Header{"Connection": {"Close"}}},
		"keep-alive":   {in: "GET / HTTP/1.1\r\nHost: h\r\nconnection: keep-alive\r\n\r\n", method: "GET", header: http.Header{"Connection": {"keep-alive"}}},
		"trimmed, duplicates kept in order": {
			in: "GET / HTTP/1.1\r\nHost: h\r\nx-a:  1 \t\r\nX-A: 2\r\nx-b:\r\n\r\n", method: "GET",
			header: http.Header{"X-A": {"1", "2"}, "X-B": {""}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			h, v := parseHead([]byte(tc.in), 4096)
			if v != taken {
				t.Fatalf("verdict %d, want taken", v)
			}
			if h.method != tc.method || h.contentLength != tc.length || h.close != tc.close || !reflect.DeepEqual(h.header, tc.header) {
				t.Fatalf("got %s length %d close %v header %v", h.method, h.contentLength, h.close, h.header)
			}
			if want := strings.Index(tc.in, "\r\n\r\n") + 4; h.size != want {
				t.Fatalf("size %d, want %d", h.size, want)
			}
		})
	}
}

func TestParseHeadHandsOff(t *testing.T) {
	const host = "Host: h\r\n"
	for name, in := range map[string]string{
		"HTTP/1.0":               "GET / HTTP/1.0\r\n" + host + "\r\n",
		"HTTP/2 preface":         "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"HEAD":                   "HEAD / HTTP/1.1\r\n" + host + "\r\n",
		"PUT":                    "PUT / HTTP/1.1\r\n" + host + "\r\n",
		"lower-case method":      "post / HTTP/1.1\r\n" + host + "\r\n",
		"absolute form":          "GET http://h/ HTTP/1.1\r\n" + host + "\r\n",
		"asterisk":               "GET * HTTP/1.1\r\n" + host + "\r\n",
		"two spaces":             "GET  / HTTP/1.1\r\n" + host + "\r\n",
		"space in target":        "GET /a b HTTP/1.1\r\n" + host + "\r\n",
		"high byte in target":    "GET /\xff HTTP/1.1\r\n" + host + "\r\n",
		"chunked":                "POST / HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked\r\n\r\n",
		"length and chunked":     "POST / HTTP/1.1\r\n" + host + "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
		"two lengths":            "POST / HTTP/1.1\r\n" + host + "Content-Length: 3\r\nContent-Length: 3\r\n\r\n",
		"signed length":          "POST / HTTP/1.1\r\n" + host + "Content-Length: +3\r\n\r\n",
		"length list":            "POST / HTTP/1.1\r\n" + host + "Content-Length: 3, 3\r\n\r\n",
		"huge length":            "POST / HTTP/1.1\r\n" + host + "Content-Length: 9999999999999999999\r\n\r\n",
		"GET with body":          "GET / HTTP/1.1\r\n" + host + "Content-Length: 3\r\n\r\n",
		"expect":                 "POST / HTTP/1.1\r\n" + host + "Expect: 100-continue\r\nContent-Length: 3\r\n\r\n",
		"upgrade":                "GET / HTTP/1.1\r\n" + host + "Upgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
		"connection token list":  "GET / HTTP/1.1\r\n" + host + "Connection: keep-alive, x-hop\r\n\r\n",
		"te":                     "GET / HTTP/1.1\r\n" + host + "TE: trailers\r\n\r\n",
		"folded line":            "GET / HTTP/1.1\r\n" + host + "X-A: 1\r\n 2\r\n\r\n",
		"space before colon":     "GET / HTTP/1.1\r\n" + host + "X-A : 1\r\n\r\n",
		"no colon":               "GET / HTTP/1.1\r\n" + host + "X-A\r\n\r\n",
		"bare LF inside":         "GET / HTTP/1.1\r\n" + host + "X-A: 1\nX-B: 2\r\n\r\n",
		"bare LF line endings":   "GET / HTTP/1.1\nHost: h\n\n\r\n\r\n",
		"control byte in value":  "GET / HTTP/1.1\r\n" + host + "X-A: 1\x00\r\n\r\n",
		"no host":                "GET / HTTP/1.1\r\n\r\n",
		"two hosts":              "GET / HTTP/1.1\r\n" + host + host + "\r\n",
		"bad host":               "GET / HTTP/1.1\r\nHost: a b\r\n\r\n",
		"head larger than limit": "GET / HTTP/1.1\r\n" + host + "X-A: " + strings.Repeat("a", 200) + "\r\n\r\n",
		"no end within limit":    "GET / HTTP/1.1\r\n" + host + "X-A: " + strings.Repeat("a", 200),
	} {
		t.Run(name, func(t *testing.T) {
			if _, v := parseHead([]byte(in), 128); v != handOff {
				t.Fatalf("verdict %d, want handOff", v)
			}
		})
	}
}

func TestParseHeadIncomplete(t *testing.T) {
	for _, in := range []string{"", "G", "POST /v1/chat/completions HTTP/1.1\r\nHost: cart\r\n", post[:strings.Index(post, "\r\n\r\n")+2]} {
		if _, v := parseHead([]byte(in), 4096); v != incomplete {
			t.Fatalf("%q: verdict %d, want incomplete", in, v)
		}
	}
}

// FuzzParseHead holds the fast parser to net/http's reading: whatever it
// takes, http.ReadRequest reads the same way (method, target, host,
// header fields, length, close, and where the head ends), so no request
// is framed differently by the two paths.
func FuzzParseHead(f *testing.F) {
	f.Add([]byte(post))
	f.Add([]byte("GET /v1/models HTTP/1.1\r\nHost: cart\r\nConnection: close\r\n\r\n"))
	f.Add([]byte("POST /a?b=%20c HTTP/1.1\r\nHost: [::1]:80\r\nX-A: 1\r\nx-a: \xfe2\r\nContent-Length: 0\r\n\r\nGET"))
	f.Add([]byte("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		h, v := parseHead(in, 4096)
		if v != taken {
			return
		}
		rd := bytes.NewReader(in)
		br := bufio.NewReader(rd)
		req, err := http.ReadRequest(br)
		if err != nil {
			t.Fatalf("the fast path takes a head net/http refuses (%v): %q", err, in)
		}
		if consumed := len(in) - rd.Len() - br.Buffered(); consumed != h.size {
			t.Fatalf("head ends at %d, net/http says %d: %q", h.size, consumed, in)
		}
		if req.Method != h.method || req.RequestURI != h.target || req.URL.String() != h.url.String() || req.Host != h.host {
			t.Fatalf("request line differs: %s %s %s %s against %s %s %s %s", req.Method, req.RequestURI, req.URL, req.Host,
				h.method, h.target, h.url, h.host)
		}
		if req.ContentLength != h.contentLength || req.Close != h.close || len(req.TransferEncoding) != 0 {
			t.Fatalf("framing differs: length %d close %v te %v against %d %v", req.ContentLength, req.Close, req.TransferEncoding,
				h.contentLength, h.close)
		}
		if !reflect.DeepEqual(req.Header, h.header) {
			t.Fatalf("fields differ: %v against %v", req.Header, h.header)
		}
	})
}
