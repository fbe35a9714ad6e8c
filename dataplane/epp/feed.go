package epp

import (
	"bytes"
	"io"
	"net/http"
	"sync"
)

// feed is the request body as the proxy's handler reads it: the chunks
// the gateway streams, appended by the stream's goroutine, which never
// waits for the reader (it must go on reading the gRPC stream, to see a
// reset). What it holds is bounded: past limit bytes it keeps nothing
// more, and the reader, having seen more than the proxy accepts, answers
// 413 (or, with a Content-Length, stops reading at that length anyway).
type feed struct {
	mu     sync.Mutex
	ready  chan struct{} // a value when something changed
	chunks [][]byte
	total  int64
	limit  int64
	done   bool  // end of the body
	err    error // the stream ended before the body did
}

func newFeed(limit int64) *feed {
	return &feed{ready: make(chan struct{}, 1), limit: limit}
}

func (f *feed) wake() {
	select {
	case f.ready <- struct{}{}:
	default:
	}
}

// write adds a chunk. The chunk is the feed's from now on (gRPC decodes
// every message into fresh memory).
func (f *feed) write(b []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done || f.err != nil || len(b) == 0 {
		return
	}
	if room := f.limit + 1 - f.total; room < int64(len(b)) {
		b = b[:max(room, 0)]
	}
	f.total += int64(len(b))
	if len(b) > 0 {
		f.chunks = append(f.chunks, b)
	}
	f.wake()
}

// close ends the body (end_of_stream, or trailers).
func (f *feed) close() {
	f.mu.Lock()
	f.done = true
	f.mu.Unlock()
	f.wake()
}

// abort ends it with err (the stream is gone).
func (f *feed) abort(err error) {
	f.mu.Lock()
	if f.err == nil {
		f.err = err
	}
	f.mu.Unlock()
	f.wake()
}

// Read implements io.Reader for the handler.
func (f *feed) Read(p []byte) (int, error) {
	for {
		f.mu.Lock()
		if len(f.chunks) > 0 {
			n := copy(p, f.chunks[0])
			if n == len(f.chunks[0]) {
				f.chunks[0] = nil
				f.chunks = f.chunks[1:]
			} else {
				f.chunks[0] = f.chunks[0][n:]
			}
			f.mu.Unlock()
			return n, nil
		}
		done, err := f.done, f.err
		f.mu.Unlock()
		switch {
		case err != nil:
			return 0, err
		case done:
			return 0, io.EOF
		}
		<-f.ready
	}
}

// Close implements io.Closer: the handler is done with the body.
func (f *feed) Close() error {
	f.mu.Lock()
	f.chunks = nil
	f.mu.Unlock()
	return nil
}

// recorder is the ResponseWriter the proxy's handler answers into when it
// answers itself (the picker relays that as an ImmediateResponse).
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header {
	if r.header == nil {
		r.header = http.Header{}
	}
	return r.header
}

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 && code >= 200 {
		r.status = code
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(b)
}
