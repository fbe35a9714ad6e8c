package health

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Each round fetches every worker's model list with the worker key and
// hands over each 200 answer; a failed fetch hands over nothing, so the
// caller keeps the last list.
func TestRoundFetchesModelLists(t *testing.T) {
	var status atomic.Int32
	status.Store(http.StatusOK)
	var list atomic.Value
	list.Store(`{"object":"list","data":[{"id":"base"}]}`)
	var auth atomic.Value
	auth.Store("")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/models" {
			return
		}
		auth.Store(r.Header.Get("Authorization"))
		w.WriteHeader(int(status.Load()))
		_, _ = io.WriteString(w, list.Load().(string))
	}))
	defer srv.Close()

	var mu sync.Mutex
	var got []string
	c := NewChecker(Config{Endpoint: "/health", Interval: time.Hour, Timeout: 2 * time.Second, FailureThreshold: 1, SuccessThreshold: 1,
		WorkerKey:      func(string) string { return "k" },
		ModelsEndpoint: "/v1/models",
		Models: func(w string, body []byte) {
			mu.Lock()
			got = append(got, w+" "+string(body))
			mu.Unlock()
		}}, nil, nil)
	c.SetWorkers([]string{srv.URL})
	calls := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}

	c.Round(context.Background())
	if g := calls(); len(g) != 1 || g[0] != srv.URL+` {"object":"list","data":[{"id":"base"}]}` || auth.Load() != "Bearer k" {
		t.Fatalf("first round: %q (auth %q)", g, auth.Load())
	}
	list.Store(`{"object":"list","data":[{"id":"base"},{"id":"lora"}]}`)
	c.Round(context.Background())
	if g := calls(); len(g) != 2 || g[1] != srv.URL+` {"object":"list","data":[{"id":"base"},{"id":"lora"}]}` {
		t.Fatalf("after loading an adapter: %q", g)
	}
	status.Store(http.StatusInternalServerError)
	c.Round(context.Background())
	if g := calls(); len(g) != 2 {
		t.Fatalf("a failed fetch was handed over: %q", g)
	}
}

// A worker added while the checker runs has its models read at once, not
// an interval later: until then model routing treats it as serving nothing.
func TestAddedWorkerModelsReadAtOnce(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"base"}]}`)
		}
	}))
	defer srv.Close()
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer other.Close()
	var mu sync.Mutex
	read := map[string]int{}
	c := NewChecker(Config{Endpoint: "/health", Interval: time.Hour, Timeout: 2 * time.Second, FailureThreshold: 1, SuccessThreshold: 1,
		ModelsEndpoint: "/v1/models",
		Models: func(w string, _ []byte) {
			mu.Lock()
			read[w]++
			mu.Unlock()
		}}, nil, nil)
	c.SetWorkers([]string{other.URL})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	count := func(w string) int {
		mu.Lock()
		defer mu.Unlock()
		return read[w]
	}
	for deadline := time.Now().Add(5 * time.Second); count(other.URL) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("first round never ran")
		}
	}
	c.SetWorkers([]string{other.URL, srv.URL})
	for deadline := time.Now().Add(5 * time.Second); count(srv.URL) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the added worker's models were not read before the next round (an hour away)")
		}
	}
	if n := count(other.URL); n != 1 {
		t.Fatalf("the worker already known was read %d times, want 1 (only fresh workers are read between rounds)", n)
	}
}
