package proxy_test

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/cartrouter/cart/dataplane/proxy"
)

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// BenchmarkProxyChat measures the proxy's own cost per small chat request
// (client, proxy and a fixed-answer upstream in one process): run with
// -cpuprofile to see where CART spends its time.
func BenchmarkProxyChat(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":10,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":8}}}`)
	}))
	defer up.Close()
	r := newRig(b, []string{up.URL})
	body := chatBody("You are a helpful assistant.", "hello there", false)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	b.ReportAllocs()
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := client.Post(r.front.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
}

// discardWriter is a minimal http.ResponseWriter for the handler benchmark:
// a recorder's own buffering would be counted as the proxy's cost.
type discardWriter struct {
	h      http.Header
	status int
}

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) WriteHeader(code int)        { d.status = code }
func (d *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (d *discardWriter) Flush()                      {}

// BenchmarkProxyHandler measures the proxy's handler path alone for a
// small routed chat request: authentication, body read, item count,
// extraction, hashing, the route decision, the attempt and the response
// copy, against an in-memory worker (no sockets), so -benchmem shows the
// proxy's own allocations per request.
func BenchmarkProxyHandler(b *testing.B) {
	answer := []byte(`{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":10,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":8}}}`)
	worker := roundTripper(func(r *http.Request) (*http.Response, error) {
		_, _ = io.Copy(io.Discard, r.Body)
		_ = r.Body.Close()
		return &http.Response{
			StatusCode: http.StatusOK, Status: "200 OK", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header:        http.Header{"Content-Type": {"application/json"}, "Content-Length": {strconv.Itoa(len(answer))}},
			Body:          io.NopCloser(bytes.NewReader(answer)),
			ContentLength: int64(len(answer)),
			Request:       r,
		}, nil
	})
	r := newRig(b, []string{"http://127.0.0.1:1"}, withOptions(func(o *proxy.Options) {
		o.Transport = worker
		o.MaxItems = 1024
		// As the overhead bench runs cart: warnings only.
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}))
	body := []byte(chatBody("You are a helpful assistant. "+longText("sys", 400), "hello there", false))
	w := &discardWriter{h: make(http.Header)}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		clear(w.h)
		w.status = 0
		r.proxy.ServeHTTP(w, req)
		if w.status != http.StatusOK {
			b.Fatalf("status %d", w.status)
		}
	}
	b.StopTimer()
	r.waitLoadZero()
}
