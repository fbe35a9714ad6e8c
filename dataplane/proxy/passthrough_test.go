package proxy_test

import (
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cartrouter/cart/dataplane/proxy"
)

// pathRecorder is a replica handler that records the paths it was sent.
type pathRecorder struct {
	mu     sync.Mutex
	paths  []string
	status int
}

func (p *pathRecorder) handle(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	p.paths = append(p.paths, r.Method+" "+r.URL.Path)
	status := p.status
	p.mu.Unlock()
	if status == 0 {
		status = http.StatusOK
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(`{"ok":true}`))
}

func (p *pathRecorder) seen() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.paths)
}

func (r *rig) do(method, path, body string) (*http.Response, string) {
	r.t.Helper()
	req, err := http.NewRequest(method, r.front.URL+path, strings.NewReader(body))
	if err != nil {
		r.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	return resp, readAll(r.t.(*testing.T), resp)
}

// POST /sim/fault through CART used to switch every replica into failure
// mode; engine admin endpoints were as reachable. Only the allowlist is
// forwarded now.
func TestPassThroughOnlyAllowlistedPaths(t *testing.T) {
	a := newBackend(t, "a")
	rec := &pathRecorder{}
	a.set(rec.handle)
	r := newRig(t, []string{a.URL}, withOptions(func(o *proxy.Options) {
		o.PassThroughPaths = append(slices.Clone(o.PassThroughPaths), "/v1/audio/*")
	}))
	for _, tc := range []struct{ method, path string }{
		{"POST", "/sim/fault"},
		{"GET", "/sim/stats"},
		{"POST", "/flush_cache"},
		{"GET", "/flush_cache"},
		{"POST", "/update_weights_from_disk"},
		{"POST", "/reset_prefix_cache"},
		{"POST", "/v1/load_lora_adapter"},
		{"POST", "/v1/embeddings/x"},                // an exact entry is not a prefix
		{"POST", "/v1/audio"},                       // a prefix entry covers what is under it only
		{"POST", "/v1/audio/..%2F..%2Fsim%2Ffault"}, // decodes to a path outside the prefix
		{"POST", "/v1/embeddings%2F..%2F..%2Fsim%2Ffault"},
		{"GET", "/v1/chat/completions"},
		{"POST", "/v1/models"},
	} {
		resp, body := r.do(tc.method, tc.path, `{"mode":"down"}`)
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s %s: status %d, want 404", tc.method, tc.path, resp.StatusCode)
			continue
		}
		assertOpenAIError(t, body, "pass_through_paths")
	}
	if got := rec.seen(); len(got) != 0 {
		t.Fatalf("the replica was sent %v", got)
	}
	for _, path := range []string{"/v1/embeddings", "/tokenize", "/v1/rerank", "/generate", "/v1/audio/transcriptions"} {
		if resp, body := r.do("POST", path, `{"input":"x"}`); resp.StatusCode != http.StatusOK {
			t.Errorf("POST %s: %d %s", path, resp.StatusCode, body)
		}
	}
	want := []string{"POST /v1/embeddings", "POST /tokenize", "POST /v1/rerank", "POST /generate", "POST /v1/audio/transcriptions"}
	if got := rec.seen(); !slices.Equal(got, want) {
		t.Fatalf("the replica was sent %v, want %v", got, want)
	}
}

// A POST to a path an operator allowed may have side effects: once a
// worker may have seen it, it is not sent to another one. The built-in
// inference APIs are still retried.
func TestNonInferencePassThroughIsNotResent(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	recA, recB := &pathRecorder{status: 503}, &pathRecorder{status: 503}
	a.set(recA.handle)
	b.set(recB.handle)
	r := newRig(t, []string{a.URL, b.URL}, withOptions(func(o *proxy.Options) {
		o.PassThroughPaths = append(slices.Clone(o.PassThroughPaths), "/admin/*")
	}))
	resp, _ := r.do("POST", "/admin/reload", `{}`)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want the worker's own 503", resp.StatusCode)
	}
	if n := len(recA.seen()) + len(recB.seen()); n != 1 {
		t.Fatalf("the admin POST reached workers %d times, want once", n)
	}
	// Reads may be retried.
	resp, _ = r.do("GET", "/admin/status", "")
	if n := len(recA.seen()) + len(recB.seen()); resp.StatusCode != http.StatusServiceUnavailable || n != 3 {
		t.Fatalf("GET: status %d, %d requests in all; want 503 after a retry (3)", resp.StatusCode, n)
	}
}

// The built-in inference APIs are resent to another worker, like the
// routed ones.
func TestInferencePassThroughIsRetried(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	recA, recB := &pathRecorder{status: 503}, &pathRecorder{}
	a.set(recA.handle)
	b.set(recB.handle)
	r := newRig(t, []string{a.URL, b.URL})
	for range 6 {
		if resp, body := r.do("POST", "/v1/embeddings", `{"input":"x"}`); resp.StatusCode != http.StatusOK {
			t.Fatalf("embeddings: %d %s; want a retry on the healthy worker", resp.StatusCode, body)
		}
	}
	if len(recA.seen()) == 0 {
		t.Fatal("the failing worker was never tried: the test proves nothing")
	}
	r.waitLoadZero()
}

// With the remote-media policy on, every body CART forwards is checked,
// not only the three routed APIs.
func TestRemoteMediaPolicyCoversPassThroughBodies(t *testing.T) {
	a := newBackend(t, "a")
	rec := &pathRecorder{}
	a.set(rec.handle)
	r := newRig(t, []string{a.URL}, withOptions(func(o *proxy.Options) {
		o.RemoteMediaPolicy = 403
	}))
	for _, tc := range []struct{ name, path, body string }{
		{"responses input_image string", "/v1/responses", `{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"http://169.254.169.254/x"}]}]}`},
		{"responses input_image object", "/v1/responses", `{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":{"url":"http://169.254.169.254/x"}}]}]}`},
		{"responses input_file", "/v1/responses", `{"model":"m","input":[{"role":"user","content":[{"type":"input_file","file_url":"http://169.254.169.254/x"}]}]}`},
		{"embeddings messages", "/v1/embeddings", `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://169.254.169.254/x"}}]}]}`},
		{"tokenize messages", "/tokenize", `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":"https://169.254.169.254/x"}]}]}`},
		{"sglang generate image_data", "/generate", `{"text":"describe","image_data":"http://169.254.169.254/x"}`},
		{"sglang generate image_data list", "/generate", `{"text":["a","b"],"image_data":["data:image/png;base64,AA","http://169.254.169.254/x"]}`},
		{"file url", "/generate", `{"text":"describe","image_data":"file:///etc/passwd"}`},
		{"routed, unknown part with uuid", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":[{"type":"x","uuid":"u","image_url":"http://169.254.169.254/x"}]}]}`},
	} {
		resp, body := r.do("POST", tc.path, tc.body)
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s: status %d, want 403: %s", tc.name, resp.StatusCode, body)
			continue
		}
		assertOpenAIError(t, body, "remote media")
	}
	// Case variants that encoding/json and Python read differently are
	// refused outright, on routed and passed-through bodies alike.
	for _, tc := range []struct{ name, path, body string }{
		{"url and URL", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://169.254.169.254/x","URL":"data:image/png;base64,AA"}}]}]}`},
		{"Messages after messages", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"Messages":[{"role":"user","content":"x"}]}`},
		{"anthropic source Type", "/v1/messages", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"http://169.254.169.254/x","Type":"base64","media_type":"image/png","data":"AA"}}]}]}`},
		{"pass-through url and URL", "/v1/embeddings", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"URL":"data:x","url":"http://169.254.169.254/x"}}]}]}`},
		{"pass-through byte order mark", "/v1/embeddings", "\xef\xbb\xbf{\"image_data\":\"http://169.254.169.254/x\"}"},
	} {
		resp, body := r.do("POST", tc.path, tc.body)
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400: %s", tc.name, resp.StatusCode, body)
			continue
		}
		assertOpenAIError(t, body, "")
	}
	if got := rec.seen(); len(got) != 0 {
		t.Fatalf("the replica was sent %v", got)
	}
	// Inline media and non-JSON bodies go through.
	for _, tc := range []struct{ path, body string }{
		{"/v1/embeddings", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`},
		{"/generate", `{"text":"x","image_data":["data:image/png;base64,AA","iVBORw0KGgo="]}`},
		{"/v1/audio/transcriptions", "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--b--\r\n"},
	} {
		if resp, body := r.do("POST", tc.path, tc.body); resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %d %s", tc.path, resp.StatusCode, body)
		}
	}
	if n := len(rec.seen()); n != 3 {
		t.Fatalf("the replica saw %d requests, want 3", n)
	}
}

func TestFileMediaURLsCanBeAllowed(t *testing.T) {
	a := newBackend(t, "a")
	r := newRig(t, []string{a.URL}, withOptions(func(o *proxy.Options) {
		o.RemoteMediaPolicy = 451
		o.AllowFileMediaURLs = true
	}))
	body := `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"file:///media/a.png"}}]}]}`
	if resp, got := r.do("POST", "/v1/chat/completions", body); resp.StatusCode != http.StatusOK {
		t.Fatalf("file: URL refused although allowed: %d %s", resp.StatusCode, got)
	}
	body = `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"file:///media/a.png"}},{"type":"image_url","image_url":{"url":"https://x/b.png"}}]}]}`
	if resp, _ := r.do("POST", "/v1/chat/completions", body); resp.StatusCode != 451 {
		t.Fatalf("remote URL after a file: URL: status %d, want 451", resp.StatusCode)
	}
}
