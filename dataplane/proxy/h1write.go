package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// writeRequest writes req's head and body on w in the form Request.Write
// gives them, for the requests the h1 transport sends (a known length, no
// trailers, an ASCII host without a zone; anything else goes through
// Request.Write). Request.Write builds a transfer
// writer, formats its lines with fmt and sorts the header keys of every
// request, which for a small proxied request costs more than the rest of
// the write; the order of header fields carries no meaning (RFC 9110
// section 5.3), so they go out in map order.
func writeRequest(w *bufio.Writer, req *http.Request) error {
	unknownLength := req.ContentLength == 0 && req.Body != nil && req.Body != http.NoBody
	if req.Trailer != nil || len(req.TransferEncoding) > 0 || unknownLength || !plainHost(hostOf(req)) {
		return req.Write(w)
	}
	closeBody := func() {
		if req.Body != nil {
			_ = req.Body.Close()
		}
	}
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	w.WriteString(method)
	w.WriteByte(' ')
	if p := req.URL.EscapedPath(); p == "" {
		w.WriteByte('/')
	} else {
		w.WriteString(p)
	}
	if req.URL.ForceQuery || req.URL.RawQuery != "" {
		w.WriteByte('?')
		w.WriteString(req.URL.RawQuery)
	}
	w.WriteString(" HTTP/1.1\r\nHost: ")
	w.WriteString(hostOf(req))
	w.WriteString("\r\n")
	if ua, ok := req.Header["User-Agent"]; !ok {
		w.WriteString("User-Agent: Go-http-client/1.1\r\n")
	} else if len(ua) > 0 && ua[0] != "" {
		writeField(w, "User-Agent", ua[0])
	}
	if req.Close && req.Header["Connection"] == nil {
		w.WriteString("Connection: close\r\n")
	}
	n := req.ContentLength
	if n > 0 || (n == 0 && (method == http.MethodPost || method == http.MethodPut || method == http.MethodPatch)) {
		// As net/http: many servers expect a length on these even when 0.
		w.WriteString("Content-Length: ")
		w.WriteString(strconv.FormatInt(n, 10))
		w.WriteString("\r\n")
	}
	for k, vs := range req.Header {
		if skipField(k) {
			continue
		}
		for _, v := range vs {
			writeField(w, k, v)
		}
	}
	if _, err := w.WriteString("\r\n"); err != nil {
		closeBody()
		return err
	}
	if n > 0 && req.Body != nil {
		copied, err := io.CopyN(w, req.Body, n)
		closeBody()
		if err != nil {
			if copied < n && err == io.EOF {
				return fmt.Errorf("http: ContentLength=%d with Body length %d", n, copied)
			}
			return err
		}
		return nil
	}
	closeBody()
	return nil
}

func hostOf(req *http.Request) string {
	if req.Host != "" {
		return req.Host
	}
	return req.URL.Host
}

// plainHost reports whether h needs none of the rewriting Request.Write
// does to a Host (punycode, removing a zone, refusing bad bytes).
func plainHost(h string) bool {
	if h == "" {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if c <= ' ' || c >= 0x7f || c == '%' || c == '/' {
			return false
		}
	}
	return true
}

// skipField: what Request.Write takes from the Request's fields and not
// from its header map.
func skipField(k string) bool {
	switch k {
	case "Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer":
		return true
	}
	return false
}

var newlineToSpace = strings.NewReplacer("\n", " ", "\r", " ")

// writeField writes one header field as Request.Write does: line breaks in
// the value become spaces, and surrounding white space goes.
func writeField(w *bufio.Writer, k, v string) {
	if strings.ContainsAny(v, "\r\n") {
		v = newlineToSpace.Replace(v)
	}
	w.WriteString(k)
	w.WriteString(": ")
	w.WriteString(strings.Trim(v, " \t"))
	w.WriteString("\r\n")
}
