package h1server

import (
	"bytes"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// head is a request head the fast path serves.
type head struct {
	method, target string
	url            *url.URL
	host           string
	header         http.Header
	contentLength  int64
	close          bool // Connection: close
	size           int  // bytes of the head, blank line included
}

// verdict says why parseHead left a head to net/http: incomplete means
// that more bytes may still make it one the fast path takes.
type verdict int

const (
	taken verdict = iota
	incomplete
	handOff
)

var crlfcrlf = []byte("\r\n\r\n")

// parseHead parses the request head at the start of buf when it is of the
// one shape the fast path serves: an HTTP/1.1 GET or POST in origin form,
// a single valid Host, plain header lines, and a body framed by one
// Content-Length (or none). Anything else — other versions and methods,
// Transfer-Encoding, Expect, Upgrade, unusual Connection tokens, folded or
// invalid lines, bare LFs, a head larger than maxHead — is handed off, and
// net/http reads the same bytes, since nothing was consumed. So the fast
// path never decides a request net/http would frame differently; the
// fuzz test holds the two to that.
func parseHead(buf []byte, maxHead int) (head, verdict) {
	end := bytes.Index(buf, crlfcrlf)
	if end < 0 {
		if len(buf) >= maxHead {
			return head{}, handOff
		}
		return head{}, incomplete
	}
	if end+4 > maxHead {
		return head{}, handOff
	}
	h := head{size: end + 4, contentLength: -1}
	text := string(buf[:end+2]) // every line ends in CRLF
	line, rest, _ := strings.Cut(text, "\r\n")
	switch {
	case strings.HasPrefix(line, "POST "):
		h.method, line = http.MethodPost, line[5:]
	case strings.HasPrefix(line, "GET "):
		h.method, line = http.MethodGet, line[4:]
	default:
		return head{}, handOff
	}
	target, proto, ok := strings.Cut(line, " ")
	if !ok || proto != "HTTP/1.1" || target == "" || target[0] != '/' || !visible(target) {
		return head{}, handOff
	}
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return head{}, handOff
	}
	h.target, h.url = target, u
	n := strings.Count(rest, "\n")
	h.header = make(http.Header, n)
	vals := make([]string, 0, n) // one backing array for the first value of each field, as textproto does
	hosts := 0
	for rest != "" {
		line, rest, _ = strings.Cut(rest, "\r\n")
		name, value, ok := strings.Cut(line, ":")
		if !ok || !httpguts.ValidHeaderFieldName(name) {
			return head{}, handOff // folded lines start with a space: not a name
		}
		value = strings.Trim(value, " \t")
		if !httpguts.ValidHeaderFieldValue(value) || strings.ContainsAny(value, "\r\n") {
			return head{}, handOff
		}
		key := textproto.CanonicalMIMEHeaderKey(name)
		switch key {
		case "Host":
			hosts++
			if hosts > 1 || !httpguts.ValidHostHeader(value) {
				return head{}, handOff
			}
			h.host = value
			continue // net/http keeps Host out of the map too
		case "Content-Length":
			n, ok := contentLength(value)
			if !ok || h.contentLength >= 0 {
				return head{}, handOff
			}
			h.contentLength = n
		case "Connection":
			switch {
			case strings.EqualFold(value, "close"):
				h.close = true
			case strings.EqualFold(value, "keep-alive"):
			default:
				return head{}, handOff
			}
		case "Transfer-Encoding", "Expect", "Upgrade", "Te", "Trailer", "Http2-Settings":
			return head{}, handOff
		}
		if vs, dup := h.header[key]; dup {
			h.header[key] = append(vs, value)
		} else {
			vals = append(vals, value)
			h.header[key] = vals[len(vals)-1 : len(vals) : len(vals)]
		}
	}
	if hosts == 0 {
		return head{}, handOff // net/http answers 400
	}
	if h.contentLength < 0 {
		h.contentLength = 0
	}
	if h.method == http.MethodGet && h.contentLength != 0 {
		return head{}, handOff
	}
	return h, taken
}

// contentLength reads a Content-Length value: digits only, no sign, at
// most 18 of them (no overflow).
func contentLength(v string) (int64, bool) {
	if v == "" || len(v) > 18 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// visible reports whether s is all visible ASCII (no spaces, controls or
// high bytes), as a request target on the fast path must be.
func visible(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}
