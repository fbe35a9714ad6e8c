package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeServer is an OpenAI-compatible streaming endpoint that waits delay
// before answering and records when each request arrived.
type fakeServer struct {
	*httptest.Server
	delay     time.Duration
	noUsage   bool
	status    int
	mu        sync.Mutex
	start     time.Time
	arrivals  []time.Duration
	msgCounts []int
}

func newFakeServer(t *testing.T, delay time.Duration) *fakeServer {
	f := &fakeServer{delay: delay, start: time.Now()}
	f.Server = httptest.NewServer(http.HandlerFunc(f.handle))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeServer) handle(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Messages []Message `json:"messages"`
		Stream   bool      `json:"stream"`
		Opts     *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
		MaxTokens int `json:"max_tokens"`
	}
	_ = json.NewDecoder(r.Body).Decode(&req)
	f.mu.Lock()
	f.arrivals = append(f.arrivals, time.Since(f.start))
	f.msgCounts = append(f.msgCounts, len(req.Messages))
	f.mu.Unlock()
	if f.status != 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(f.status)
		_, _ = w.Write([]byte(`{"error":{"message":"down","type":"server_error"}}`))
		return
	}
	select {
	case <-time.After(f.delay):
	case <-r.Context().Done():
		return
	}
	prompt := 0
	for _, m := range req.Messages {
		prompt += len(m.Content) / 4
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Sim-Replica", "fake-1")
	w.Header().Set("X-Sim-Prompt-Tokens", fmt.Sprint(prompt))
	w.Header().Set("X-Sim-Cached-Tokens", "3")
	fl := w.(http.Flusher)
	for i := range max(req.MaxTokens, 1) {
		fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"w%d \"},\"finish_reason\":null}]}\n\n", i)
		fl.Flush()
	}
	if req.Opts != nil && req.Opts.IncludeUsage && !f.noUsage {
		fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":7}}}\n\n",
			prompt, req.MaxTokens, prompt+req.MaxTokens)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	fl.Flush()
}

func userRequests(n int, every time.Duration, maxTokens int) *Workload {
	w := &Workload{Name: "t"}
	for i := range n {
		w.Requests = append(w.Requests, Request{ID: i, At: time.Duration(i) * every, MaxTokens: maxTokens,
			Messages: []Message{{Role: "user", Content: strings.Repeat("word ", 40)}}})
	}
	return w
}

// TestOpenLoopArrivalsNotDelayed: every response takes 800 ms, but the ten
// requests scheduled 20 ms apart (the last at 180 ms) must all reach the
// server on schedule, long before any response is complete.
func TestOpenLoopArrivalsNotDelayed(t *testing.T) {
	f := newFakeServer(t, 800*time.Millisecond)
	w := userRequests(10, 20*time.Millisecond, 3)
	s := NewOpenAISender(f.URL, "m", NewHTTPClient(16))
	f.start = time.Now()
	recs := Run(context.Background(), w, s, RunOptions{Concurrency: 64})
	f.mu.Lock()
	arrivals := append([]time.Duration(nil), f.arrivals...)
	f.mu.Unlock()
	if len(arrivals) != 10 {
		t.Fatalf("%d arrivals", len(arrivals))
	}
	for i, a := range arrivals {
		if a > 180*time.Millisecond+400*time.Millisecond {
			t.Errorf("arrival %d at %v: open-loop arrivals must not wait for the 800 ms responses", i, a)
		}
	}
	for _, r := range recs {
		if !r.OK() {
			t.Fatalf("record %d failed: %+v", r.ID, r)
		}
		if r.SentMs-r.ScheduledMs > 300 {
			t.Errorf("record %d dispatched %.0f ms late", r.ID, r.SentMs-r.ScheduledMs)
		}
		if r.TTFTMs < 790 || r.E2EMs < r.TTFTMs {
			t.Errorf("record %d: ttft %.0f e2e %.0f", r.ID, r.TTFTMs, r.E2EMs)
		}
		if r.Replica != "fake-1" || r.CachedTokens != 7 || r.PromptTokens != 50 || r.CompletionTokens != 3 || r.UsageFrom != "usage" {
			t.Errorf("record %d: %+v", r.ID, r)
		}
		if r.CapDelayed {
			t.Errorf("record %d cap-delayed under a cap of 64", r.ID)
		}
	}
	s2 := Summarize(recs, nil)
	if s2.Succeeded != 10 || s2.CapDelayed != 0 {
		t.Errorf("summary %+v", s2)
	}
}

func TestConcurrencyCapCounts(t *testing.T) {
	f := newFakeServer(t, 150*time.Millisecond)
	w := userRequests(5, 0, 1)
	recs := Run(context.Background(), w, NewOpenAISender(f.URL, "m", NewHTTPClient(4)), RunOptions{Concurrency: 2})
	s := Summarize(recs, nil)
	if s.Succeeded != 5 || s.CapDelayed != 3 {
		t.Errorf("succeeded %d cap-delayed %d, want 5 and 3", s.Succeeded, s.CapDelayed)
	}
}

func TestRunTimeoutBoundsRun(t *testing.T) {
	f := newFakeServer(t, 10*time.Millisecond)
	w := userRequests(2, 10*time.Second, 1)
	start := time.Now()
	recs := Run(context.Background(), w, NewOpenAISender(f.URL, "m", NewHTTPClient(4)), RunOptions{RunTimeout: 300 * time.Millisecond})
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("run took %v despite a 300 ms run timeout", el)
	}
	if !recs[0].OK() || recs[1].Error != errNotSent {
		t.Errorf("records %+v", recs)
	}
	if s := Summarize(recs, nil); s.NotSent != 1 || s.Succeeded != 1 {
		t.Errorf("summary %+v", s)
	}
}

func TestHeaderFallbackAndErrors(t *testing.T) {
	f := newFakeServer(t, 0)
	f.noUsage = true
	s := NewOpenAISender(f.URL+"/v1", "m", NewHTTPClient(2))
	res := s.Send(context.Background(), []Message{{Role: "user", Content: "abcdabcd"}}, 2, true)
	if res.Err != nil || res.UsageFrom != "headers" || res.PromptTokens != 2 || res.CachedTokens != 3 || res.Content != "w0 w1 " {
		t.Errorf("%+v", res)
	}
	bad := newFakeServer(t, 0)
	bad.status = http.StatusServiceUnavailable
	res = NewOpenAISender(bad.URL, "m", NewHTTPClient(2)).Send(context.Background(), []Message{{Role: "user", Content: "x"}}, 1, false)
	if res.Err == nil || res.Status != http.StatusServiceUnavailable {
		t.Errorf("error response: %+v", res)
	}
	if calls := len(bad.arrivals); calls != 1 {
		t.Errorf("the client retried: %d calls", calls)
	}
}

func TestMultiTurnResendsHistory(t *testing.T) {
	f := newFakeServer(t, 0)
	w, err := MultiTurnWorkload(MultiTurnConfig{Chats: 2, Turns: 3, SystemTokens: 8, QuestionTokens: 4, OutputTokens: 2, Think: 5 * time.Millisecond}, 0)
	if err != nil {
		t.Fatal(err)
	}
	recs := Run(context.Background(), w, NewOpenAISender(f.URL, "m", NewHTTPClient(4)), RunOptions{})
	if len(recs) != 6 {
		t.Fatal(len(recs))
	}
	for _, r := range recs {
		if !r.OK() || r.Chat < 0 || r.Turn < 0 {
			t.Fatalf("record %+v", r)
		}
	}
	counts := map[int]int{}
	for _, c := range f.msgCounts {
		counts[c]++
	}
	// Each chat: system+user, then +assistant+user twice.
	if counts[2] != 2 || counts[4] != 2 || counts[6] != 2 {
		t.Errorf("message counts %v, want two each of 2, 4 and 6", f.msgCounts)
	}
	// The oracle sees each turn extend the previous one's prompt.
	if recs[1].OracleCachedTokens == 0 || recs[2].OracleCachedTokens <= recs[1].OracleCachedTokens {
		t.Errorf("oracle should hit the resent history: %+v", recs[:3])
	}
}
