package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/dataplane/server"
	"github.com/cartrouter/cart/internal/testkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, append(testkit.IdleHTTPConns(),
		// The simulated engines' KV event publishers.
		testkit.IgnoreZMQPubWriter)...)
}

// baseYAML is the part of the config every test shares: loopback only, no
// open-files minimum, health checks driven by the test (an hour apart).
const baseYAML = `
server:
  host: 127.0.0.1
  port: 6700
  min_open_files: 0
  shutdown_grace_secs: 1
health:
  interval_secs: 3600
  timeout_secs: 2
  failure_threshold: 2
  success_threshold: 2
proxy:
  add_routed_peer_header: true
  initial_backoff_ms: 1
  max_backoff_ms: 10
circuit_breaker:
  failure_threshold: 3
log:
  level: error
`

// workersYAML renders a workers list; each entry is a URL optionally
// followed by extra "key: value" fields separated by ";".
func workersYAML(entries ...string) string {
	var sb strings.Builder
	sb.WriteString("workers:\n")
	for _, e := range entries {
		parts := strings.Split(e, ";")
		fmt.Fprintf(&sb, "  - url: %s\n", parts[0])
		for _, p := range parts[1:] {
			fmt.Fprintf(&sb, "    %s\n", strings.TrimSpace(p))
		}
	}
	return sb.String()
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// configFiles writes the base config and an override file (the workers
// and per-test settings) and returns both paths, in layering order.
func configFiles(t testing.TB, override string) []string {
	t.Helper()
	dir := t.TempDir()
	base, over := filepath.Join(dir, "base.yaml"), filepath.Join(dir, "override.yaml")
	writeFile(t, base, baseYAML)
	writeFile(t, over, override)
	return []string{base, over}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func newAllInOne(t testing.TB, paths []string) *server.AllInOne {
	t.Helper()
	cfg, err := config.Load(paths...)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(config.RoleAllInOne); err != nil {
		t.Fatal(err)
	}
	a, err := server.NewAllInOne(cfg, paths, discardLogger(), 1)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// serveHTTP serves a's HTTP server on a loopback listener (no health loop:
// the test drives a.Health.Round itself) and returns its base URL.
func serveHTTP(t *testing.T, a *server.AllInOne) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = a.HTTP.Serve(ln) }()
	t.Cleanup(func() {
		_ = a.HTTP.Close()
		<-done
	})
	return "http://" + ln.Addr().String()
}

// runAllInOne runs a (health loop and index maintenance included) on a
// loopback listener until the test ends.
func runAllInOne(t testing.TB, a *server.AllInOne) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- a.Run(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-errc:
			if err != nil && !errors.Is(err, http.ErrServerClosed) {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
	return "http://" + ln.Addr().String()
}

// replica is a fake inference server: it answers chat requests, counts
// them, and serves /health with a status the test sets.
type replica struct {
	*httptest.Server
	name   string
	health atomic.Int32
	chats  atomic.Int64
	mu     sync.Mutex
	hold   chan struct{} // non-nil: chat requests wait for it
}

func newReplica(t *testing.T, name string) *replica {
	t.Helper()
	rp := &replica{name: name}
	rp.health.Store(http.StatusOK)
	rp.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			w.WriteHeader(int(rp.health.Load()))
			return
		case "/v1/models":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"cart-sim","object":"model"}]}`)
			return
		case "/metrics":
			// An engine that never queues, as flow control reads it.
			_, _ = io.WriteString(w, "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		rp.chats.Add(1)
		rp.mu.Lock()
		hold := rp.hold
		rp.mu.Unlock()
		if hold != nil {
			<-hold
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi from %s"}}],"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12}}`, name)
	}))
	t.Cleanup(rp.Close)
	return rp
}

func chatBody(system, user string, stream bool, maxTokens int) string {
	b, _ := json.Marshal(map[string]any{
		"model":          "cart-sim",
		"stream":         stream,
		"max_tokens":     maxTokens,
		"stream_options": map[string]any{"include_usage": true},
		"messages": []map[string]string{
			{"role": "system", "content": system},
			{"role": "user", "content": user},
		},
	})
	return string(b)
}

// chat posts a chat completion and returns the status, the routed peer and
// the body.
func chat(t *testing.T, base, body string) (int, string, string) {
	t.Helper()
	resp, b, err := testkit.PostJSON(t, base+"/v1/chat/completions", body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get(proxy.HeaderRoutedPeer), b
}

func getJSON(t testing.TB, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode
}

func workers(t testing.TB, base string) map[string]proxy.WorkerView {
	t.Helper()
	var body struct{ Workers []proxy.WorkerView }
	getJSON(t, base+"/workers", &body)
	out := make(map[string]proxy.WorkerView)
	for _, w := range body.Workers {
		out[w.URL] = w
	}
	return out
}

func longText(seed string, n int) string {
	var sb strings.Builder
	for sb.Len() < n {
		fmt.Fprintf(&sb, "%s-%d ", seed, sb.Len())
	}
	return sb.String()[:n]
}
