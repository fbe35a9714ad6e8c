package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// startReplica serves a replica on a loopback httptest server (httptest
// binds 127.0.0.1) and tears both down when the test ends.
func startReplica(t *testing.T, cfg Config) (*Server, *httptest.Server) {
	t.Helper()
	s := New(cfg)
	return s, startServer(t, s)
}

// startServer serves an already constructed replica, for tests that set
// hooks before serving.
func startServer(t *testing.T, s *Server) *httptest.Server {
	t.Helper()
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		// Close the replica first so long generations end before the
		// server waits for its handlers.
		_ = s.Close()
		ts.Close()
	})
	return ts
}

// post sends body (a string, []byte, or a value to encode as JSON).
func post(t *testing.T, ctx context.Context, ts *httptest.Server, path string, body any, header ...string) (*http.Response, error) {
	t.Helper()
	var raw []byte
	switch b := body.(type) {
	case string:
		raw = []byte(b)
	case []byte:
		raw = b
	default:
		var err error
		if raw, err = json.Marshal(b); err != nil {
			t.Fatalf("encoding request: %v", err)
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+path, bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return ts.Client().Do(req)
}

// mustPost is post that fails the test on transport errors and returns the
// status and body.
func mustPost(t *testing.T, ts *httptest.Server, path string, body any, header ...string) (*http.Response, []byte) {
	t.Helper()
	resp, err := post(t, context.Background(), ts, path, body, header...)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	return resp, b
}

func get(t *testing.T, ts *httptest.Server, path string) (*http.Response, []byte, error) {
	t.Helper()
	resp, err := ts.Client().Get(ts.URL + path)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

func chatBody(user string, extra ...any) map[string]any {
	m := map[string]any{
		"model":    "test-model",
		"messages": []map[string]any{{"role": "user", "content": user}},
	}
	for i := 0; i+1 < len(extra); i += 2 {
		m[extra[i].(string)] = extra[i+1]
	}
	return m
}

// tokenPrompt returns a /v1/completions body whose prompt is exactly the
// given token ids, which makes block boundaries exact.
func tokenPrompt(ids []int) map[string]any {
	return map[string]any{"model": "test-model", "prompt": ids, "max_tokens": 1}
}

// seq returns n consecutive ids starting at from.
func seq(from, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}

type chatResult struct {
	Choices []struct {
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage openAIUsage `json:"usage"`
}

// openAIUsage is the usage object of an OpenAI answer as a client reads it.
type openAIUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// complete sends a non-streamed OpenAI request, checks it succeeded and that
// the X-Sim headers agree with the body's usage, and returns the result.
func complete(t *testing.T, ts *httptest.Server, path string, body any, header ...string) chatResult {
	t.Helper()
	r, err := tryComplete(ts, path, body, header...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// tryComplete is complete for use off the test goroutine, where t.Fatal
// must not be called.
func tryComplete(ts *httptest.Server, path string, body any, header ...string) (chatResult, error) {
	var r chatResult
	raw, err := json.Marshal(body)
	if err != nil {
		return r, err
	}
	req, err := http.NewRequest(http.MethodPost, ts.URL+path, bytes.NewReader(raw))
	if err != nil {
		return r, err
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := ts.Client().Do(req)
	if err != nil {
		return r, fmt.Errorf("POST %s: %w", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return r, fmt.Errorf("reading %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return r, fmt.Errorf("POST %s: status %d: %s", path, resp.StatusCode, b)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("decoding %s: %w", b, err)
	}
	if got := resp.Header.Get("X-Sim-Cached-Tokens"); got != strconv.Itoa(r.Usage.PromptTokensDetails.CachedTokens) {
		return r, fmt.Errorf("X-Sim-Cached-Tokens = %q, usage says %d", got, r.Usage.PromptTokensDetails.CachedTokens)
	}
	if got := resp.Header.Get("X-Sim-Prompt-Tokens"); got != strconv.Itoa(r.Usage.PromptTokens) {
		return r, fmt.Errorf("X-Sim-Prompt-Tokens = %q, usage says %d", got, r.Usage.PromptTokens)
	}
	return r, nil
}

// cached sends a token-id completion and returns its cached token count.
func cached(t *testing.T, ts *httptest.Server, ids []int) int {
	t.Helper()
	return complete(t, ts, pathCompletions, tokenPrompt(ids)).Usage.PromptTokensDetails.CachedTokens
}

// sseEvent is one server-sent event.
type sseEvent struct {
	name string
	data string
}

// sseReader reads events one at a time, so tests can observe a stream while
// it is still being produced.
type sseReader struct {
	sc *bufio.Scanner
}

func newSSEReader(r io.Reader) *sseReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	return &sseReader{sc: sc}
}

// next returns the next event, or an error at the end or on a broken stream.
func (r *sseReader) next() (sseEvent, error) {
	var ev sseEvent
	seen := false
	for r.sc.Scan() {
		line := r.sc.Text()
		if line == "" {
			if seen {
				return ev, nil
			}
			continue
		}
		seen = true
		switch {
		case strings.HasPrefix(line, "event: "):
			ev.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			ev.data = strings.TrimPrefix(line, "data: ")
		}
	}
	if err := r.sc.Err(); err != nil {
		return ev, err
	}
	return ev, io.EOF
}

// readAll returns all remaining events and the error that ended the stream
// (io.EOF for a clean end).
func (r *sseReader) readAll() ([]sseEvent, error) {
	var out []sseEvent
	for {
		ev, err := r.next()
		if err != nil {
			return out, err
		}
		out = append(out, ev)
	}
}
