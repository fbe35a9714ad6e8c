package h1server

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
)

// response is the http.ResponseWriter of a fast-path request. It frames
// the answer as net/http does: a body the handler finishes before
// flushing and within one buffer gets a Content-Length, a longer or
// flushed one is chunked unless the handler set Content-Length, declared
// trailers force chunking; Date and a sniffed Content-Type are added when
// missing; statuses without a body refuse one.
type response struct {
	c       *conn
	req     *http.Request
	header  http.Header
	cancel  context.CancelFunc // the request's context
	reqBody *body              // nil without one

	status      int
	wroteHeader bool  // the final status is chosen
	sent        bool  // the head is written
	noBody      bool  // the status allows no body
	chunked     bool  // the body goes in chunks
	length      int64 // the handler's Content-Length, -1 if none
	written     int64
	pending     []byte // body held back until the head is sent
	trailers    []string
	closeAfter  bool
	err         error
}

func (w *response) Header() http.Header { return w.header }

func (w *response) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if w.wroteHeader {
		w.c.logf("h1server: superfluous WriteHeader(%d) for %s", code, w.req.URL.Path)
		return
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		w.interim(code)
		return
	}
	w.wroteHeader, w.status, w.length = true, code, -1
	w.noBody = code < 200 || code == http.StatusNoContent || code == http.StatusNotModified
	if v := w.header.Get("Content-Length"); v != "" {
		if n, ok := contentLength(strings.TrimSpace(v)); ok && !w.noBody {
			w.length = n
		} else {
			w.header.Del("Content-Length")
		}
	}
}

// interim writes a 1xx answer at once, with the header map as it is.
func (w *response) interim(code int) {
	if w.err != nil {
		return
	}
	bw := w.c.bw
	writeStatus(bw, code)
	for k, vs := range w.header {
		writeField(bw, k, vs)
	}
	_, _ = bw.WriteString("\r\n")
	w.fail(bw.Flush())
}

func (w *response) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.noBody {
		return 0, http.ErrBodyNotAllowed
	}
	if w.err != nil {
		return 0, w.err
	}
	if w.length >= 0 && w.written+int64(len(p)) > w.length {
		return 0, http.ErrContentLength
	}
	w.written += int64(len(p))
	if !w.sent {
		if w.length < 0 && len(w.pending)+len(p) <= bufSize {
			if w.pending == nil {
				w.pending = w.c.pendingBuf()
			}
			w.pending = append(w.pending, p...)
			return len(p), nil
		}
		w.sendHead(false, p)
	}
	w.body(p)
	if w.err != nil {
		return 0, w.err
	}
	return len(p), nil
}

// body writes p as body bytes, in a chunk when chunked.
func (w *response) body(p []byte) {
	if len(p) == 0 || w.err != nil {
		return
	}
	bw := w.c.bw
	if w.chunked {
		var hex [16]byte
		_, _ = bw.Write(strconv.AppendInt(hex[:0], int64(len(p)), 16))
		_, _ = bw.WriteString("\r\n")
		_, _ = bw.Write(p)
		_, err := bw.WriteString("\r\n")
		w.fail(err)
		return
	}
	_, err := bw.Write(p)
	w.fail(err)
}

func (w *response) fail(err error) {
	if err != nil && w.err == nil {
		w.err = err
		w.closeAfter = true
		// As in net/http, a client that cannot be written to is gone: the
		// request's work stops.
		w.cancel()
	}
}

// sendHead writes the status line and header fields, and then what the
// handler wrote before: done says the handler returned, so a held-back
// body is all of it; first is the write that made the head go now.
func (w *response) sendHead(done bool, first []byte) {
	w.sent = true
	h := w.header
	if declared := h["Trailer"]; len(declared) > 0 {
		for _, v := range declared {
			for _, k := range strings.Split(v, ",") {
				if k = textproto.CanonicalMIMEHeaderKey(textproto.TrimString(k)); k != "" {
					w.trailers = append(w.trailers, k)
				}
			}
		}
	}
	if strings.EqualFold(h.Get("Connection"), "close") || w.c.srv.shutdown.Load() || !w.reqBody.drainable() {
		w.closeAfter = true
	}
	var length string
	switch {
	case w.noBody:
	case w.length >= 0:
		length = strconv.FormatInt(w.length, 10)
	case done && len(w.trailers) == 0:
		w.length = int64(len(w.pending))
		length = strconv.FormatInt(w.length, 10)
	default:
		w.chunked = true
	}
	if _, typed := h["Content-Type"]; !typed && !w.noBody {
		sniff := w.pending
		if len(sniff) == 0 {
			sniff = first
		}
		if len(sniff) > 0 {
			h.Set("Content-Type", http.DetectContentType(sniff))
		}
	}
	bw := w.c.bw
	writeStatus(bw, w.status)
	for k, vs := range h {
		switch k {
		case "Content-Length", "Transfer-Encoding", "Connection", "Trailer":
			continue
		}
		if strings.HasPrefix(k, http.TrailerPrefix) {
			continue
		}
		writeField(bw, k, vs)
	}
	if _, dated := h["Date"]; !dated {
		_, _ = bw.WriteString("Date: ")
		_, _ = bw.WriteString(httpDate())
		_, _ = bw.WriteString("\r\n")
	}
	if length != "" {
		_, _ = bw.WriteString("Content-Length: ")
		_, _ = bw.WriteString(length)
		_, _ = bw.WriteString("\r\n")
	}
	if w.chunked {
		_, _ = bw.WriteString("Transfer-Encoding: chunked\r\n")
		if len(w.trailers) > 0 {
			writeField(bw, "Trailer", []string{strings.Join(w.trailers, ", ")})
		}
	}
	if w.closeAfter {
		_, _ = bw.WriteString("Connection: close\r\n")
	}
	_, err := bw.WriteString("\r\n")
	w.fail(err)
	if len(w.pending) > 0 {
		p := w.pending
		w.pending = p[:0]
		w.body(p)
	}
}

// Flush sends the head and what the handler wrote, and pushes it out.
func (w *response) Flush() { _ = w.FlushError() }

// FlushError is what http.ResponseController.Flush calls.
func (w *response) FlushError() error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.sent {
		w.sendHead(false, nil)
	}
	if w.err == nil {
		w.fail(w.c.bw.Flush())
	}
	return w.err
}

// SetReadDeadline and SetWriteDeadline are what http.ResponseController
// calls; they set the connection's.
func (w *response) SetReadDeadline(t time.Time) error  { return w.c.rwc.SetReadDeadline(t) }
func (w *response) SetWriteDeadline(t time.Time) error { return w.c.rwc.SetWriteDeadline(t) }

// finish ends the answer after the handler returned: the head if not yet
// sent, the last chunk and trailers, a flush.
func (w *response) finish() error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.sent {
		w.sendHead(true, nil)
	}
	bw := w.c.bw
	if w.chunked && w.err == nil {
		_, _ = bw.WriteString("0\r\n")
		for _, k := range w.trailers {
			if vs := w.header[k]; len(vs) > 0 && httpguts.ValidTrailerHeader(k) {
				writeField(bw, k, vs)
			}
		}
		for k, vs := range w.header {
			if name, ok := strings.CutPrefix(k, http.TrailerPrefix); ok && httpguts.ValidTrailerHeader(name) {
				writeField(bw, name, vs)
			}
		}
		_, err := bw.WriteString("\r\n")
		w.fail(err)
	}
	if w.length >= 0 && w.written < w.length {
		// The handler promised more than it wrote: the client cannot tell
		// where this answer ends, so the connection does not go on.
		w.closeAfter = true
	}
	if w.err == nil {
		w.fail(bw.Flush())
	}
	w.pending = nil
	return w.err
}

func writeStatus(bw *bufio.Writer, code int) {
	_, _ = bw.WriteString("HTTP/1.1 ")
	_ = bw.WriteByte(byte('0' + code/100))
	_ = bw.WriteByte(byte('0' + code/10%10))
	_ = bw.WriteByte(byte('0' + code%10))
	_ = bw.WriteByte(' ')
	text := http.StatusText(code)
	if text == "" {
		text = "status code " + strconv.Itoa(code)
	}
	_, _ = bw.WriteString(text)
	_, _ = bw.WriteString("\r\n")
}

// writeField writes a header field's values, as net/http does: invalid
// names are dropped, line breaks in values become spaces, so no value can
// add a line of its own.
func writeField(bw *bufio.Writer, k string, vs []string) {
	if !httpguts.ValidHeaderFieldName(k) {
		return
	}
	for _, v := range vs {
		if strings.ContainsAny(v, "\r\n") {
			v = strings.NewReplacer("\r", " ", "\n", " ").Replace(v)
		}
		v = textproto.TrimString(v)
		_, _ = bw.WriteString(k)
		_, _ = bw.WriteString(": ")
		_, _ = bw.WriteString(v)
		_, _ = bw.WriteString("\r\n")
	}
}

// httpDate is the Date header's value, formatted once a second.
func httpDate() string {
	now := time.Now()
	sec := now.Unix()
	if d := dateCache.Load(); d != nil && d.sec == sec {
		return d.text
	}
	d := &cachedDate{sec: sec, text: now.UTC().Format(http.TimeFormat)}
	dateCache.Store(d)
	return d.text
}

type cachedDate struct {
	sec  int64
	text string
}

var dateCache atomic.Pointer[cachedDate]
