package proxy

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
)

// readResponse reads a response head from br. The common answer of a
// worker (HTTP/1.1, a final status, a Content-Length, plain header lines,
// all of it already in the buffer) is parsed here, in place: one string
// for the whole head, no textproto reader, no transfer parsing. Anything
// else (interim and bodiless statuses, chunked or close-delimited bodies,
// Connection or Transfer-Encoding headers, a HEAD request, odd bytes, a
// head not yet wholly received) goes to http.ReadResponse, which reads
// the same bytes since nothing was consumed.
func readResponse(br *bufio.Reader, req *http.Request) (*http.Response, error) {
	// Waits for the first bytes; its error is the read's.
	if _, err := br.Peek(1); err != nil {
		return nil, err
	}
	if resp := fastResponse(br, req); resp != nil {
		return resp, nil
	}
	return http.ReadResponse(br, req)
}

var crlfcrlf = []byte("\r\n\r\n")

func fastResponse(br *bufio.Reader, req *http.Request) *http.Response {
	if req.Method == http.MethodHead {
		return nil
	}
	buf, _ := br.Peek(br.Buffered())
	end := bytes.Index(buf, crlfcrlf)
	if end < 0 {
		return nil
	}
	head := string(buf[:end+2]) // lines, each ending in CRLF
	line, rest, _ := strings.Cut(head, "\r\n")
	// "HTTP/1.1 200 OK"
	if len(line) < 12 || line[:9] != "HTTP/1.1 " || len(line) > 12 && line[12] != ' ' {
		return nil
	}
	code := 0
	for _, c := range []byte(line[9:12]) {
		if c < '0' || c > '9' {
			return nil
		}
		code = code*10 + int(c-'0')
	}
	if code < 200 || code == http.StatusNoContent || code == http.StatusNotModified {
		return nil
	}
	if !printable(line) {
		return nil
	}
	status := line[9:] // "200 OK"
	n := strings.Count(rest, "\n")
	h := make(http.Header, n)
	vals := make([]string, n) // one backing array, as textproto does
	length := int64(-1)
	for rest != "" {
		line, rest, _ = strings.Cut(rest, "\r\n")
		colon := strings.IndexByte(line, ':')
		if colon <= 0 || !validFieldName(line[:colon]) || !printable(line[colon+1:]) {
			return nil
		}
		k := textproto.CanonicalMIMEHeaderKey(line[:colon])
		v := textproto.TrimString(line[colon+1:]) // no CR or LF left to trim: printable
		switch k {
		case "Transfer-Encoding", "Connection", "Trailer":
			return nil
		case "Content-Length": // one, digits only, as net/http: no sign, not "-0"
			l, err := strconv.ParseUint(v, 10, 63)
			if err != nil || length >= 0 {
				return nil
			}
			length = int64(l)
		}
		vals[0] = v
		if prior := h[k]; prior != nil {
			h[k] = append(prior, v)
		} else {
			h[k] = vals[:1:1]
		}
		vals = vals[1:]
	}
	if length < 0 {
		return nil
	}
	_, _ = br.Discard(end + 4)
	resp := &http.Response{
		Status: status, StatusCode: code,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, ContentLength: length, Request: req,
		Body: http.NoBody,
	}
	if length > 0 {
		resp.Body = &fixedBody{br: br, n: length}
	}
	return resp
}

// printable: no control bytes but HTAB (which also rules out a bare CR or
// LF inside a line).
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// validFieldName: a token (RFC 9110 section 5.6.2), which also refuses
// the white space before a colon that smuggling relies on.
func validFieldName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// fixedBody is a body of known length read from the connection's buffer.
// The read that takes its last byte also reports io.EOF, as net/http's
// does, so the connection goes back to the pool without another read.
type fixedBody struct {
	br *bufio.Reader
	n  int64
}

func (b *fixedBody) Read(p []byte) (int, error) {
	if b.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.br.Read(p)
	b.n -= int64(n)
	if b.n == 0 {
		return n, io.EOF
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

func (b *fixedBody) Close() error { return nil }
