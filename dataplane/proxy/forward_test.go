package proxy_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/cartrouter/cart/dataplane/proxy"
)

// seen is what a worker received, handed to the test over a channel.
type seen struct {
	host   string
	header http.Header
	body   string
	query  string
}

// recordingWorker answers every request with answer after sending what it
// received to the returned channel.
func recordingWorker(t *testing.T, answer http.HandlerFunc) (*backend, <-chan seen) {
	t.Helper()
	got := make(chan seen, 8)
	b := newBackend(t, "a")
	b.set(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- seen{host: r.Host, header: r.Header.Clone(), body: string(body), query: r.URL.RawQuery}
		answer(w, r)
	})
	return b, got
}

func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(5 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// Hop-by-hop headers (the fixed list and whatever Connection names) stay
// on their hop in both directions, the client's credentials and its
// forwarding headers never reach the worker, and the worker is addressed
// by its own host while the client's goes in X-Forwarded-Host.
func TestForwardedRequestHeaders(t *testing.T) {
	a, got := recordingWorker(t, func(w http.ResponseWriter, _ *http.Request) {
		h := w.Header()
		h.Set("Connection", "X-Worker-Hop")
		h.Set("X-Worker-Hop", "secret")
		h.Set("Keep-Alive", "timeout=5")
		h.Set("Proxy-Authenticate", "Basic")
		h.Set("X-Routed-Peer", "forged")
		h.Set("X-Kept", "kept")
		_, _ = io.WriteString(w, `{}`)
	})
	r := newRig(t, []string{a.URL})
	req, _ := http.NewRequest(http.MethodPost, r.front.URL+"/v1/chat/completions", strings.NewReader(chatBody("s", "u", false)))
	h := req.Header
	h.Set("Content-Type", "application/json")
	h.Set("Connection", "X-Client-Hop, keep-alive")
	h.Set("X-Client-Hop", "hop")
	h.Set("Keep-Alive", "timeout=5")
	h.Set("Proxy-Authorization", "Basic cHJveHk6cHc=")
	h.Set("Proxy-Connection", "keep-alive")
	h.Set("Te", "trailers, deflate;q=0.5")
	h.Set("Upgrade", "websocket")
	h.Set("Authorization", "Bearer client-key")
	h.Set("X-Api-Key", "client-key")
	h.Set("X-Forwarded-For", "203.0.113.9")
	h.Set("X-Forwarded-Host", "forged.example")
	h.Set("X-Forwarded-Proto", "https")
	h.Set("Forwarded", "for=203.0.113.9")
	h.Set("X-Routed-Peer", "forged")
	h.Set("X-End-To-End", "yes")
	h.Set("User-Agent", "")
	req.Host = "api.example.com"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	s := receive(t, got, "the worker's request")

	for _, k := range []string{"X-Client-Hop", "Keep-Alive", "Proxy-Authorization", "Proxy-Connection", "Upgrade",
		"Authorization", "X-Api-Key", "Forwarded", "X-Routed-Peer", "User-Agent"} {
		if v, ok := s.header[k]; ok {
			t.Errorf("worker got %s: %q", k, v)
		}
	}
	want := map[string]string{
		"Te": "trailers", "X-Forwarded-For": "127.0.0.1", "X-Forwarded-Host": "api.example.com",
		"X-Forwarded-Proto": "http", "X-End-To-End": "yes",
	}
	for k, v := range want {
		if g := strings.Join(s.header[k], ","); g != v {
			t.Errorf("worker got %s %q, want %q", k, g, v)
		}
	}
	if s.header.Get("X-Request-Id") == "" {
		t.Error("worker got no X-Request-Id")
	}
	if u, _ := url.Parse(a.URL); s.host != u.Host {
		t.Errorf("worker got Host %q, want its own %q", s.host, u.Host)
	}

	for _, k := range []string{"X-Worker-Hop", "Keep-Alive", "Proxy-Authenticate", "X-Routed-Peer"} {
		if v, ok := resp.Header[k]; ok {
			t.Errorf("client got %s: %q", k, v)
		}
	}
	if resp.Header.Get("X-Kept") != "kept" {
		t.Errorf("client lost an end-to-end header: %v", resp.Header)
	}
	r.waitLoadZero()
}

// A query a worker might split differently (';') is re-encoded; a clean
// one passes byte for byte.
func TestForwardedQuery(t *testing.T) {
	a, got := recordingWorker(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, `{}`) })
	r := newRig(t, []string{a.URL})
	for q, want := range map[string]string{"b=2&a=%2F": "b=2&a=%2F", "a=1;b=2": "", "a=%zz&b=1": "b=1"} {
		resp, err := http.Post(r.front.URL+"/tokenize?"+q, "application/json", strings.NewReader(`{"prompt":"x"}`))
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		if s := receive(t, got, "the worker's request"); s.query != want {
			t.Errorf("query %q reached the worker as %q, want %q", q, s.query, want)
		}
	}
}

// Trailers the worker announces go out as trailers, and so do the ones it
// did not announce; a client asking for them says so to the worker.
func TestTrailersRelayed(t *testing.T) {
	a, got := recordingWorker(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Trailer", "X-Usage")
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
		w.Header().Set("X-Usage", "12")
		w.Header().Set(http.TrailerPrefix+"X-Late", "late")
	})
	r := newRig(t, []string{a.URL})
	resp := r.post("/v1/chat/completions", chatBody("s", "u", false), "TE", "trailers")
	if body := readAll(t, resp); body != `{"ok":true}` {
		t.Fatalf("body %q", body)
	}
	if resp.Trailer.Get("X-Usage") != "12" || resp.Trailer.Get("X-Late") != "late" {
		t.Fatalf("trailers %v, want X-Usage and X-Late", resp.Trailer)
	}
	if te := receive(t, got, "the worker's request").header.Get("Te"); te != "trailers" {
		t.Fatalf("worker got TE %q", te)
	}
	r.waitLoadZero()
}

// Each chunk of a stream reaches the client before the worker writes the
// next: the worker waits for the client to have the first event.
func TestStreamFlushedPerChunk(t *testing.T) {
	for _, ctype := range []string{"text/event-stream; charset=utf-8", "application/json"} {
		t.Run(ctype, func(t *testing.T) {
			first := make(chan struct{})
			a := newBackend(t, "a")
			a.set(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", ctype) // no length: chunked
				_, _ = io.WriteString(w, "data: 1\n\n")
				w.(http.Flusher).Flush()
				select {
				case <-first:
				case <-r.Context().Done():
					return
				}
				_, _ = io.WriteString(w, "data: 2\n\n")
			})
			r := newRig(t, []string{a.URL})
			resp := r.post("/v1/chat/completions", chatBody("s", "u", true))
			defer resp.Body.Close()
			lines := make(chan string, 4)
			go func() {
				br := bufio.NewReader(resp.Body)
				for {
					l, err := br.ReadString('\n')
					if err != nil {
						close(lines)
						return
					}
					lines <- l
				}
			}()
			if l := receive(t, lines, "the first event"); l != "data: 1\n" {
				t.Fatalf("first line %q", l)
			}
			close(first)
			var rest strings.Builder
			for l := range lines {
				rest.WriteString(l)
			}
			if rest.String() != "\ndata: 2\n\n" {
				t.Fatalf("rest of the stream %q", rest.String())
			}
			r.waitLoadZero()
		})
	}
}

// A client that hangs up cancels the worker's request, waiting for the
// headers or in the middle of the body, and the decision is settled.
func TestClientCancelReachesWorker(t *testing.T) {
	for _, midStream := range []bool{false, true} {
		name := map[bool]string{false: "before headers", true: "mid-stream"}[midStream]
		t.Run(name, func(t *testing.T) {
			started, cancelled := make(chan struct{}), make(chan struct{})
			a := newBackend(t, "a")
			a.set(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if midStream {
					w.Header().Set("Content-Type", "text/event-stream")
					_, _ = io.WriteString(w, "data: 1\n\n")
					w.(http.Flusher).Flush()
				}
				close(started)
				select {
				case <-r.Context().Done():
					close(cancelled)
				case <-time.After(10 * time.Second):
				}
			})
			r := newRig(t, []string{a.URL})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.front.URL+"/v1/chat/completions", strings.NewReader(chatBody("s", "u", true)))
			errc := make(chan error, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				errc <- err
			}()
			receive(t, started, "the worker to get the request")
			cancel()
			receive(t, cancelled, "the worker's request to be cancelled")
			if err := receive(t, errc, "the client to return"); err == nil {
				t.Fatal("the cancelled client read a whole answer")
			}
			r.waitLoadZero()
		})
	}
}

// A client expecting 100 Continue gets it and its answer; the worker,
// sent a body CART already holds, is not asked for a second 100; and the
// headers of an interim answer do not stick to the final one.
func TestInterimResponses(t *testing.T) {
	a, got := recordingWorker(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Link", "</a.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		_, _ = io.WriteString(w, `{"ok":true}`)
	})
	r := newRig(t, []string{a.URL})
	client := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: 10 * time.Second}}
	defer client.CloseIdleConnections()
	body := chatBody("s", "u", false)
	req, _ := http.NewRequest(http.MethodPost, r.front.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Expect", "100-continue")
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK || b != `{"ok":true}` {
		t.Fatalf("%d %q", resp.StatusCode, b)
	}
	if time.Since(start) > 9*time.Second {
		t.Fatal("the client had to wait out its 100-continue timeout")
	}
	s := receive(t, got, "the worker's request")
	if s.body != body {
		t.Fatalf("worker got body %q", s.body)
	}
	if e := s.header.Get("Expect"); e != "" {
		t.Fatalf("worker got Expect %q", e)
	}
	if l := resp.Header.Get("Link"); l != "" {
		t.Fatalf("the 103's Link header stuck to the final answer: %q", l)
	}
	r.waitLoadZero()
}

// The routed-peer header, when on, is CART's and never the worker's.
func TestRoutedPeerHeaderIsCARTs(t *testing.T) {
	a := newBackend(t, "a")
	a.set(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Routed-Peer", "forged")
		_, _ = io.WriteString(w, `{}`)
	})
	r := newRig(t, []string{a.URL}, withOptions(func(o *proxy.Options) {
		o.AddRoutedPeerHeader = true
	}))
	resp := r.post("/v1/chat/completions", chatBody("s", "u", false))
	readAll(t, resp)
	if got := resp.Header.Values("X-Routed-Peer"); len(got) != 1 || got[0] != a.URL {
		t.Fatalf("X-Routed-Peer %v, want [%s]", got, a.URL)
	}
	r.waitLoadZero()
}
