package epp

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"sync"
	"time"
)

// feed is the request body as the proxy's handler reads it: the chunks
// the gateway streams, appended by the stream's goroutine. It holds at
// most feedWindow unread bytes (plus the one chunk that crossed it): past
// that the stream's goroutine waits for the handler to read, so gRPC's
// flow control holds the gateway back and the body's memory is counted
// where the proxy counts it, in the handler's read (max_inflight_body_bytes).
// Past limit bytes in all it keeps nothing more, and the reader, having
// seen more than the proxy accepts, answers 413 (or, with a
// Content-Length, stops reading at that length anyway).
type feed struct {
	mu       sync.Mutex
	ready    chan struct{} // a value when something changed for the reader
	space    chan struct{} // a value when something changed for the writer
	chunks   [][]byte
	buffered int64 // bytes in chunks
	total    int64
	limit    int64
	done     bool  // end of the body
	closed   bool  // the reader is done with it: chunks are dropped
	err      error // the stream ended before the body did
	// deadline is the proxy's body read timeout (proxy.body_read_timeout_secs),
	// set as on a socket: a gateway that stalls mid-body gets the proxy's
	// 408, not a stream held until the gateway resets it.
	deadline time.Time
	timer    *time.Timer
}

// feedWindow is how much of a body the feed holds for a reader that has
// not read it yet.
const feedWindow = 256 << 10

func newFeed(limit int64) *feed {
	return &feed{ready: make(chan struct{}, 1), space: make(chan struct{}, 1), limit: limit}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// write adds a chunk, waiting while the reader is a window behind, until
// ctx ends (the stream is gone). The chunk is the feed's from now on
// (gRPC decodes every message into fresh memory).
func (f *feed) write(ctx context.Context, b []byte) error {
	for {
		f.mu.Lock()
		if f.done || f.closed || f.err != nil || len(b) == 0 {
			f.mu.Unlock()
			return nil
		}
		if f.buffered < feedWindow {
			if room := f.limit + 1 - f.total; room < int64(len(b)) {
				b = b[:max(room, 0)]
			}
			f.total += int64(len(b))
			if len(b) > 0 {
				f.chunks = append(f.chunks, b)
				f.buffered += int64(len(b))
			}
			f.mu.Unlock()
			signal(f.ready)
			return nil
		}
		f.mu.Unlock()
		select {
		case <-f.space:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// close ends the body (end_of_stream, or trailers).
func (f *feed) close() {
	f.mu.Lock()
	f.done = true
	f.mu.Unlock()
	signal(f.ready)
}

// abort ends it with err (the stream is gone).
func (f *feed) abort(err error) {
	f.mu.Lock()
	if f.err == nil {
		f.err = err
	}
	f.mu.Unlock()
	signal(f.ready)
	signal(f.space)
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
			f.buffered -= int64(n)
			f.mu.Unlock()
			signal(f.space)
			return n, nil
		}
		done, err, deadline := f.done, f.err, f.deadline
		f.mu.Unlock()
		switch {
		case err != nil:
			return 0, err
		case done:
			return 0, io.EOF
		case !deadline.IsZero() && !time.Now().Before(deadline):
			// A net.Error whose Timeout() is true, as a socket's.
			return 0, os.ErrDeadlineExceeded
		}
		<-f.ready
	}
}

// setReadDeadline is the socket's SetReadDeadline for a body that arrives
// in ext_proc messages: Read fails with os.ErrDeadlineExceeded once t has
// passed with nothing to read; the zero time lifts it.
func (f *feed) setReadDeadline(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deadline = t
	if f.timer != nil {
		f.timer.Stop()
		f.timer = nil
	}
	if !t.IsZero() {
		f.timer = time.AfterFunc(time.Until(t), func() { signal(f.ready) })
	}
}

// Close implements io.Closer: the handler is done with the body (it
// returned, or it picked: the pick carries the body it read). What comes
// after is dropped, and a writer waiting for room goes on.
func (f *feed) Close() error {
	f.mu.Lock()
	f.chunks, f.buffered, f.closed = nil, 0, true
	if f.timer != nil {
		f.timer.Stop()
		f.timer = nil
	}
	f.mu.Unlock()
	signal(f.space)
	return nil
}

// recorder is the ResponseWriter the proxy's handler answers into when it
// answers itself (the picker relays that as an ImmediateResponse).
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
	feed   *feed // the request's body, nil without one
}

// SetReadDeadline lets the proxy's body read timeout (set through
// http.ResponseController, as on a connection) reach the feed.
func (r *recorder) SetReadDeadline(t time.Time) error {
	if r.feed == nil {
		return http.ErrNotSupported
	}
	r.feed.setReadDeadline(t)
	return nil
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
