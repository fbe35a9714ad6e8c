package proxy_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// connServer is a worker that counts the connections made to it and the
// ones it has closed.
type connServer struct {
	*httptest.Server
	opened, closed atomic.Int64
}

func newConnServer(t *testing.T, h http.HandlerFunc) *connServer {
	t.Helper()
	s := &connServer{}
	s.Server = httptest.NewUnstartedServer(h)
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			s.opened.Add(1)
		case http.StateClosed, http.StateHijacked:
			s.closed.Add(1)
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

func answerChat(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"x","choices":[]}`)
}

// Requests one after another share one connection to the worker.
func TestUpstreamConnectionReused(t *testing.T) {
	s := newConnServer(t, answerChat)
	r := newRig(t, []string{s.URL})
	for i := range 5 {
		resp := r.post("/v1/chat/completions", chatBody("system", "hello", false))
		if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	r.waitLoadZero()
	if n := s.opened.Load(); n != 1 {
		t.Fatalf("%d connections for 5 sequential requests, want 1", n)
	}
}

// A connection the worker closed while it sat idle is not used for the
// next request, which goes out on a new one at once.
func TestUpstreamIdleConnectionClosedByWorker(t *testing.T) {
	s := newConnServer(t, answerChat)
	r := newRig(t, []string{s.URL})
	post := func() {
		t.Helper()
		resp := r.post("/v1/chat/completions", chatBody("system", "hello", false))
		if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	}
	post()
	r.waitLoadZero()
	s.CloseClientConnections()
	deadline := time.Now().Add(5 * time.Second)
	for s.closed.Load() < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the worker did not close the connection")
		}
		time.Sleep(time.Millisecond)
	}
	// One worker: had the request gone into the closed connection, there
	// would be no other to retry on, and the client would get a 502.
	post()
	r.waitLoadZero()
	if n := s.opened.Load(); n != 2 {
		t.Fatalf("%d connections, want 2 (the closed one replaced)", n)
	}
}

// A response the client abandons mid-stream does not leave its connection
// in the pool with the rest of the stream unread: the next request gets a
// clean answer.
func TestUpstreamConnectionDroppedAfterAbort(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	stream := oneEventThenWait(release)
	s := newConnServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Test") == "stream" {
			stream(w, r)
			return
		}
		answerChat(w, r)
	})
	r := newRig(t, []string{s.URL})
	resp := r.post("/v1/chat/completions", chatBody("system", "hello", true), "X-Test", "stream")
	buf := make([]byte, 4)
	if _, err := io.ReadAtLeast(resp.Body, buf, 1); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	r.waitLoadZero()
	resp = r.post("/v1/chat/completions", chatBody("system", "hello", false))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK || body != `{"id":"x","choices":[]}` {
		t.Fatalf("after an aborted stream: %d %q", resp.StatusCode, body)
	}
	r.waitLoadZero()
}

// An interim 103 Early Hints from the worker reaches the client before
// the answer, as it does through net/http's Transport.
func TestUpstreamEarlyHintsPassed(t *testing.T) {
	s := newConnServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		answerChat(w, r)
	})
	r := newRig(t, []string{s.URL})
	var got []int
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			if h.Get("Link") == "" {
				t.Errorf("1xx %d without its Link header", code)
			}
			got = append(got, code)
			return nil
		},
	})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.front.URL+"/v1/chat/completions", strings.NewReader(chatBody("s", "u", false)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if len(got) != 1 || got[0] != http.StatusEarlyHints {
		t.Fatalf("interim responses %v, want [103]", got)
	}
	r.waitLoadZero()
}
