package proxy

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// bodyReader replays the buffered request body for one attempt. Close
// drops the reference, so once the transport has sent the body and the
// proxy has chosen its final answer, the buffer can be collected even
// while the response streams on.
type bodyReader struct{ b []byte }

func newBodyReader(b []byte) (io.ReadCloser, error) { return &bodyReader{b: b}, nil }

// smallBody is the largest body sent with newSmallBodyReader: with the
// request headers it fits the transport's 4 KiB write buffer.
const smallBody = 3 << 10

// newSmallBodyReader replays a small body from a reader net/http knows to
// be in memory, which lets the transport send headers and body in one
// write instead of flushing the headers on their own first: one syscall
// and one TCP segment less per request. The price is that the transport
// keeps the body referenced while the response streams, which for at most
// smallBody bytes is less than the buffers of the connection itself.
func newSmallBodyReader(b []byte) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(b)), nil
}

func (r *bodyReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

func (r *bodyReader) Close() error { r.b = nil; return nil }

// sniffHead and sniffTail bound how much of a response is kept to read the
// usage report: OpenAI puts usage at the end (last JSON field, or the last
// SSE chunk), Anthropic streams put input tokens in the first event.
const (
	sniffHead = 2048
	sniffTail = 4096
)

// trackedBody watches a response body on its way to the client: it aborts
// the upstream attempt when no chunk arrives for the idle timeout (a stalled
// stream) and keeps the head and tail to read the worker's usage report.
type trackedBody struct {
	rc     *attemptBody
	idle   time.Duration
	cancel context.CancelFunc
	timer  *time.Timer

	mu   sync.Mutex // Read and Close may race when the client aborts
	head []byte
	tail []byte
	buf  *sniffBuf // backs head and tail; nil before the first byte and once released
	done bool      // released: nothing more is kept
}

// sniffBuf is the fixed room head and tail live in, pooled: every response
// is watched, and growing two slices for each would be two allocations
// per request.
type sniffBuf struct {
	head [sniffHead]byte
	tail [sniffTail]byte
}

var sniffBufs = sync.Pool{New: func() any { return new(sniffBuf) }}

// release returns the kept bytes' room to the pool once usage has been
// read: a late Read racing a client abort keeps nothing more.
func (t *trackedBody) release() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.done = true
	if t.buf != nil {
		sniffBufs.Put(t.buf)
		t.buf, t.head, t.tail = nil, nil, nil
	}
}

func (t *trackedBody) start() {
	if t.idle > 0 {
		t.timer = time.AfterFunc(t.idle, t.cancel)
	}
}

func (t *trackedBody) Read(b []byte) (int, error) {
	n, err := t.rc.Read(b)
	if n > 0 {
		if t.timer != nil {
			t.timer.Reset(t.idle)
		}
		t.see(b[:n])
	}
	return n, err
}

// see keeps what usage needs of a chunk of the body.
func (t *trackedBody) see(p []byte) {
	t.mu.Lock()
	t.keep(p)
	t.mu.Unlock()
}

func (t *trackedBody) keep(p []byte) {
	if t.done {
		return
	}
	if t.buf == nil {
		t.buf = sniffBufs.Get().(*sniffBuf)
		t.head, t.tail = t.buf.head[:0], t.buf.tail[:0]
	}
	// Within their capacities, the appends below never reallocate.
	if room := sniffHead - len(t.head); room > 0 {
		t.head = append(t.head, p[:min(room, len(p))]...)
	}
	if len(p) >= sniffTail {
		t.tail = append(t.tail[:0], p[len(p)-sniffTail:]...)
		return
	}
	if over := len(t.tail) + len(p) - sniffTail; over > 0 {
		t.tail = append(t.tail[:0], t.tail[over:]...)
	}
	t.tail = append(t.tail, p...)
}

func (t *trackedBody) Close() error {
	if t.timer != nil {
		t.timer.Stop()
	}
	return t.rc.Close()
}

// usage is what a worker reported: prompt, cached and completion tokens
// (-1 when absent).
type usage struct{ prompt, cached, completion int }

// usage reads token counts from the kept bytes; -1 when absent. A report
// without cache fields leaves cached at -1 (unknown), never 0: vLLM omits
// prompt_tokens_details unless started with --enable-prompt-tokens-details,
// and its /v1/messages usage never has cache_read_input_tokens, so reading
// their absence as "nothing cached" would count every hit as a miss.
func (t *trackedBody) usage() usage {
	t.mu.Lock()
	defer t.mu.Unlock()
	u := usage{prompt: -1, cached: -1, completion: -1}
	// OpenAI / vLLM / SGLang: usage.prompt_tokens and
	// usage.prompt_tokens_details.cached_tokens.
	if v, ok := lastInt(t.tail, `"prompt_tokens":`); ok {
		u.prompt = v
		if c, ok := lastInt(t.tail, `"cached_tokens":`); ok {
			u.cached = c
		}
		if c, ok := lastInt(t.tail, `"completion_tokens":`); ok {
			u.completion = c
		}
		return u
	}
	// Anthropic and the Responses API: output_tokens, in the tail (a
	// stream's last event, or the body's usage).
	if c, ok := lastInt(t.tail, `"output_tokens":`); ok {
		u.completion = c
	}
	// Anthropic: input_tokens excludes cache reads and writes. A stream
	// reports usage in message_start (head) and message_delta (tail); a
	// buffer holding the cache fields is preferred to one that does not.
	found := false
	for _, buf := range [][]byte{t.tail, t.head} {
		in, ok := lastInt(buf, `"input_tokens":`)
		if !ok {
			continue
		}
		created, _ := lastInt(buf, `"cache_creation_input_tokens":`)
		created = max(created, 0)
		read, known := lastInt(buf, `"cache_read_input_tokens":`)
		if known {
			return usage{prompt: in + read + created, cached: read, completion: u.completion}
		}
		if !found {
			u, found = usage{prompt: in + created, cached: -1, completion: u.completion}, true
		}
	}
	return u
}

// lastInt finds the last `key` followed by an integer. JSON strings escape
// quotes, so the key cannot be forged by generated text.
func lastInt(b []byte, key string) (int, bool) {
	i := bytes.LastIndex(b, []byte(key))
	if i < 0 {
		return -1, false
	}
	rest := b[i+len(key):]
	for len(rest) > 0 && (rest[0] == ' ' || rest[0] == '\t') {
		rest = rest[1:]
	}
	end := 0
	for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
		end++
	}
	if end == 0 || end > 12 {
		return -1, false
	}
	v, err := strconv.Atoi(string(rest[:end]))
	if err != nil {
		return -1, false
	}
	return v, true
}

// statusWriter records the status and whether the client went away while
// writing. It unwraps for http.ResponseController, so flushing and
// deadlines still reach the real connection.
type statusWriter struct {
	http.ResponseWriter
	status     int
	clientGone bool
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 && code >= 200 { // 1xx are interim, not the answer
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	n, err := s.ResponseWriter.Write(b)
	if err != nil {
		s.clientGone = true
	}
	return n, err
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
